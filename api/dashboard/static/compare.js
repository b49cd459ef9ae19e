// Compare: the selected runs' error curves on shared axes, one colour per run (2015 Fig. 1
// and Fig. 6 in one picture), and their settings with the differing cells highlighted.

import { api } from "./api.js";
import { ERROR_LAYOUT, errorTraces, PALETTE, plot } from "./charts.js";
import { selected } from "./runs.js";
import { h, notice, percent, shortId } from "./ui.js";

export async function render(view, ctx) {
  const ids = (ctx.params.get("ids") ?? selected().join(",")).split(",").filter(Boolean);
  view.append(h("h1", {}, "Compare runs"));
  if (ids.length < 1) {
    view.append(notice("Select two or more runs on the Runs page, then press Compare."));
    return;
  }
  const runs = await Promise.all(
    ids.map(async (id) => {
      const [job, metrics] = await Promise.all([
        api(`/jobs/${id}`, { signal: ctx.signal }),
        api(`/jobs/${id}/metrics?names=train/error,val/error,test/error&max_points=1000`, {
          signal: ctx.signal,
        }),
      ]);
      return { job, series: metrics.series };
    }),
  );
  const labels = uniqueLabels(runs.map((r) => r.job));
  const chart = h("div.chart", { id: "chart-compare" });
  const table = settingsTable(runs, labels);
  const onlyDifferences = h(
    "label.check",
    {},
    h("input", {
      type: "checkbox",
      id: "only-differences",
      onchange: (e) => table.classList.toggle("only-differences", e.target.checked),
    }),
    "only the settings that differ",
  );
  view.append(
    h("div.card", {}, chart),
    h("h2", {}, "Settings"),
    onlyDifferences,
    h("div.card", {}, table),
  );
  const traces = runs.flatMap((run, i) =>
    errorTraces(run.series, { color: PALETTE[i % PALETTE.length], label: labels[i] }),
  );
  plot(chart, traces, { ...ERROR_LAYOUT, height: 460 });
}

function uniqueLabels(jobs) {
  const names = jobs.map((job) => job.name || job.model || job.kind);
  return names.map((name, i) =>
    names.indexOf(name) !== names.lastIndexOf(name) ? `${name} ${shortId(jobs[i].id)}` : name,
  );
}

/** Flatten a spec to dotted keys: {"recipe.lr": 0.1, "model.name": "resnet20", ...}. */
function flatten(value, prefix = "", into = {}) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [key, item] of Object.entries(value))
      flatten(item, prefix ? `${prefix}.${key}` : key, into);
  } else {
    into[prefix] = Array.isArray(value) ? value.join(", ") : value;
  }
  return into;
}

function settingsTable(runs, labels) {
  const flat = runs.map(({ job }) => ({
    ...flatten(job.spec),
    status: job.status,
    params: job.results.params,
    "best test error": percent(job.results.best_test_error),
    "final test error": percent(job.results.final_test_error),
  }));
  const keys = [...new Set(flat.flatMap(Object.keys))].filter((k) => k !== "kind").sort();
  const show = (v) => (v === undefined || v === null ? "–" : String(v));
  const rows = keys.map((key) => {
    const values = flat.map((f) => show(f[key]));
    const differs = new Set(values).size > 1;
    return h(
      "tr",
      { dataset: { key, differs: differs ? "1" : "0" } },
      h("th", {}, key),
      values.map((v) => h(differs ? "td.diff" : "td", {}, v)),
    );
  });
  const head = h(
    "tr",
    {},
    h("th", {}, "setting"),
    runs.map(({ job }, i) =>
      h(
        "th",
        {},
        h(
          "a",
          { href: `#/runs/${job.id}`, style: `color:${PALETTE[i % PALETTE.length]}` },
          labels[i],
        ),
      ),
    ),
  );
  return h("table", { id: "settings" }, h("thead", {}, head), h("tbody", {}, rows));
}

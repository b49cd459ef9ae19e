// A study: its progress, its figure (for the degradation preset as 2015 Fig. 6 draws it:
// plain nets left, residual nets right), its results per cell beside the papers' numbers,
// its jobs, the results files, and its actions. Polls while a job is unfinished.

import { API, api, save } from "./api.js";
import { bandTraces, PALETTE, panelAnchors, panelsLayout, plot } from "./charts.js";
import { drawSearch, isSearch } from "./study_search.js";
import { ACTIVE, actionButton, h, notice, shortId, statusBadge, when } from "./ui.js";

const POLL_MS = 2000;
// 2015 Fig. 6: "dashed lines denote training error, and bold lines denote testing error".
const LINES = {
  "train/error": { label: "train", line: { width: 1, dash: "dash" } },
  "test/error": { label: "test", line: { width: 3 } },
};
const ERRORS = [
  ["final_train_error", "final train error"],
  ["final_test_error", "final test error"],
  ["best_test_error", "best test error"],
];

export async function render(view, ctx) {
  const parts = {
    header: h("div"),
    messages: h("div"),
    progress: h("div.card", { id: "study-progress" }),
    chart: h("div.chart", { id: "chart-study" }),
    results: h("div.card", { id: "study-results" }),
    claims: h("div.card", { id: "study-claims" }),
    search: h("div", { id: "study-search" }),
  };
  view.append(
    parts.header,
    parts.messages,
    parts.progress,
    parts.search,
    h("div.card", {}, parts.chart),
    h("h2", {}, "Results"),
    parts.results,
    parts.claims,
  );
  let timer = null;
  const load = async () => {
    clearTimeout(timer);
    const [study, ...curves] = await Promise.all([
      api(`/studies/${ctx.id}`, { signal: ctx.signal }),
      ...Object.keys(LINES).map((metric) =>
        api(`/studies/${ctx.id}/curves?metric=${metric}&center=median&band=minmax`, {
          signal: ctx.signal,
        }),
      ),
    ]);
    drawHeader(parts, study, ctx, load);
    drawProgress(parts.progress, study);
    drawFigure(parts.chart, study, curves);
    drawResults(parts, study);
    drawClaims(parts.claims, study);
    if (isSearch(study)) await drawSearch(parts.search, study, ctx);
    if (ACTIVE.has(study.state) && !ctx.signal.aborted) timer = setTimeout(poll, POLL_MS);
  };
  const poll = () =>
    load().catch((error) => {
      if (ctx.signal.aborted) return;
      parts.messages.replaceChildren(notice(`live updates paused: ${error.message}`, true));
      timer = setTimeout(poll, POLL_MS);
    });
  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  await load();
}

export const studyTitle = (study) => study.name || `study ${shortId(study.id)}`;

/** A cell's values in words: "resnet20", "shortcut_variant=identity", "resnet56 · B". */
export function cellLabel(values) {
  const show = (value) =>
    value && typeof value === "object"
      ? Object.entries(value)
          .map(([k, v]) => `${k}=${v}`)
          .join(", ")
      : String(value);
  return Object.values(values).map(show).join(" · ");
}

function drawHeader(parts, study, ctx, reload) {
  const act = (label, action, cls) => actionButton(parts.messages, label, action, cls);
  const buttons = [];
  if (ctx.can("train") && ACTIVE.has(study.state)) {
    buttons.push(
      act("Cancel", async () => {
        await api(`/studies/${study.id}/cancel`, { method: "POST" });
        parts.messages.replaceChildren(notice("Cancel requested for every unfinished job."));
        await reload();
      }),
    );
  }
  if (ctx.can("train") && !ACTIVE.has(study.state)) {
    buttons.push(
      act(
        "Delete",
        async () => {
          const question = `Delete study ${studyTitle(study)}, its ${study.counts.total} jobs and their files?`;
          if (!window.confirm(question)) return;
          await api(`/studies/${study.id}`, { method: "DELETE" });
          ctx.navigate("#/studies");
        },
        "button.danger",
      ),
    );
  }
  const facts = [
    study.preset ? `preset ${study.preset}` : "custom grid",
    study.scale && `${study.scale} scale`,
    `seeds ${study.spec.seeds.join(", ")}`,
    `${study.max_parallel} at once`,
    `created ${when(study.created_at)}`,
  ];
  parts.header.replaceChildren(
    h("h1", {}, studyTitle(study), " ", statusBadge(study.state)),
    h("p.muted", {}, facts.filter(Boolean).join(" · ")),
    h("div.row", { id: "actions" }, buttons),
  );
}

function drawProgress(card, study) {
  const { counts } = study;
  const fraction = counts.total ? counts.done / counts.total : 0;
  const more = ["running", "queued", "failed", "cancelled", "pruned"]
    .filter((status) => counts[status])
    .map((status) => `${counts[status]} ${status}`);
  card.replaceChildren(
    h(
      "span.row",
      {},
      h("span.progress.wide", {}, h("div", { style: `width:${100 * fraction}%` })),
      h("span", { id: "study-done" }, `${counts.done} / ${counts.total} jobs done`),
      more.length ? h("span.muted", {}, more.join(" · ")) : null,
    ),
  );
}

/**
 * The degradation preset as 2015 Fig. 6: plain nets left, residual nets right, one colour
 * per depth in both; any other study in one panel, one colour per cell.
 */
function drawFigure(div, study, curves) {
  const paired = study.preset === "degradation";
  const depthColours = paired ? coloursByDepth(study.cells) : null;
  const panels = paired ? ["plain nets", "residual nets"] : [""];
  const traces = panelAnchors(panels.length);
  for (const [index, metric] of Object.keys(LINES).entries()) {
    const { label, line } = LINES[metric];
    for (const curve of curves[index].cells) {
      const name = cellLabel(curve.values);
      const color = paired
        ? depthColours.get(depthOf(curve.values))
        : PALETTE[curve.cell % PALETTE.length];
      traces.push(
        ...bandTraces(curve, {
          name: metric === "test/error" ? name : `${name} ${label}`,
          color,
          line,
          panel: paired && isResidual(curve.values) ? 2 : 1,
          legend: metric === "test/error",
          meta: { cell: curve.cell, metric, group: name },
        }),
      );
    }
  }
  const title = "Error (%) — training dashed, test bold; median over seeds, min–max band";
  plot(div, traces, panelsLayout(panels, { title }));
}

const depthOf = (values) => Number(String(values["model.name"]).match(/(\d+)$/)?.[1]);
const isResidual = (values) => !String(values["model.name"]).startsWith("plain");

function coloursByDepth(cells) {
  const depths = [...new Set(cells.map((cell) => depthOf(cell.values)))].sort((a, b) => a - b);
  return new Map(depths.map((depth, i) => [depth, PALETTE[i % PALETTE.length]]));
}

function drawResults(parts, study) {
  const axes = Object.keys(study.spec.grid);
  const metricLabel = ERRORS.find(([key]) => key === study.metric)?.[1] ?? study.metric;
  const jobsByCell = new Map(study.cells.map((cell) => [cell.cell, []]));
  for (const job of study.jobs) jobsByCell.get(job.cell)?.push(job);
  const head = h(
    "tr",
    {},
    axes.map((axis) => h("th", {}, axis)),
    h("th.num", {}, "seeds"),
    ERRORS.map(([key, label]) =>
      h(key === study.metric ? "th.num.measure" : "th.num", {}, `${label} (%)`),
    ),
    h("th.num", { title: `the papers' ${metricLabel}` }, "paper (%)"),
    h("th.num", {}, "ours − paper"),
    ciHead(study),
    h("th", {}, "jobs"),
  );
  const rows = study.cells.map((cell) =>
    h(
      "tr",
      { dataset: { cell: cell.cell } },
      axes.map((axis) => h("td", {}, cellLabel({ [axis]: cell.values[axis] }))),
      h("td.num", { dataset: { col: "seeds" } }, seedsText(cell)),
      ERRORS.map(([key]) => h("td.num", { dataset: { col: key } }, spread(cell[key]))),
      h("td.num", { dataset: { col: "paper" } }, inPercent(cell.paper)),
      h("td.num", { dataset: { col: "difference" } }, signed(cell.difference)),
      ciCell(cell, study),
      h("td", {}, jobLinks(jobsByCell.get(cell.cell) ?? [])),
    ),
  );
  const downloads = [
    ["csv", "CSV"],
    ["md", "Markdown"],
  ].map(([suffix, label]) =>
    downloadLink(
      parts,
      `/studies/${study.id}/results.${suffix}`,
      `study-${study.id}.${suffix}`,
      label,
    ),
  );
  parts.results.replaceChildren(
    ...[
      h("table", { id: "study-table" }, h("thead", {}, head), h("tbody", {}, rows)),
      h(
        "p.muted",
        {},
        `Errors in %, median over the finished seeds (min–max); the papers' number is the ${metricLabel}.`,
      ),
      study.source
        ? h("p", { id: "study-source" }, h("strong", {}, "Source: "), study.source)
        : null,
      study.note ? h("p.muted", { id: "study-note" }, study.note) : null,
      h("div.row", { id: "downloads" }, "Download the results: ", downloads),
    ].filter(Boolean),
  );
}

// What the seeds say with confidence: the median's 95% interval of the study's metric, and
// the preset's claims with their verdicts and the seeds an open one needs.

function ciHead(study) {
  const title = `95% bootstrap interval of the median ${study.metric}`;
  return h("th.num", { title }, "median 95% CI");
}

function ciCell(cell, study) {
  const ci = cell[study.metric]?.median_ci;
  const text = ci ? `${inPercent(ci[0])}–${inPercent(ci[1])}` : "–";
  return h("td.num", { dataset: { col: "median_ci" } }, text);
}

const VERDICT_BADGE = { reproduced: "succeeded", contradicted: "failed", inconclusive: "queued" };
const verdictBadge = (verdict) =>
  h(`span.status.${VERDICT_BADGE[verdict]}`, { dataset: { verdict } }, verdict);
// An open claim's seeds per cell; "> 50" where no number of seeds the planner tries would do.
const seedsNeeded = (claim) => claim.seeds_needed ?? (claim.advice ? "> 50" : "");
const effectText = (effect) => (effect === null ? "–" : effect.toFixed(2));

function drawClaims(card, study) {
  const claims = study.claims ?? [];
  if (!claims.length) {
    card.replaceChildren();
    card.hidden = true;
    return;
  }
  card.hidden = false;
  const head = h(
    "tr",
    {},
    ["claim", "verdict", "p", "effect", "n", "seeds needed"].map((label) =>
      h(label === "claim" || label === "verdict" ? "th" : "th.num", {}, label),
    ),
  );
  const rows = claims.map((claim) =>
    h(
      "tr",
      { dataset: { verdict: claim.verdict } },
      h("td", {}, claim.claim),
      h("td", {}, verdictBadge(claim.verdict)),
      h("td.num", {}, claim.p === null ? "–" : claim.p.toPrecision(3)),
      h("td.num", { title: claim.effect_name }, effectText(claim.effect)),
      h("td.num", {}, claim.n.join(", ")),
      h("td.num", { title: claim.advice ?? "" }, seedsNeeded(claim)),
    ),
  );
  card.replaceChildren(
    h("h3", {}, "The papers' claims"),
    h("table", { id: "claims-table" }, h("thead", {}, head), h("tbody", {}, rows)),
    h(
      "p.muted",
      {},
      `p: one-sided ${claims[0].test} in the claimed direction, Holm-adjusted across ` +
        `the claims; effect: ${claims[0].effect_name}, positive where the first cell is higher. ` +
        "Seeds needed: per cell, for 80% power to settle an inconclusive claim.",
    ),
  );
}

function seedsText(cell) {
  const extra = [
    cell.failed && `${cell.failed} failed`,
    cell.cancelled && `${cell.cancelled} cancelled`,
  ].filter(Boolean);
  return `${cell.seeds_done.length}/${cell.jobs}${extra.length ? ` (${extra.join(", ")})` : ""}`;
}

const inPercent = (x) => (x === null || x === undefined ? "–" : (100 * x).toFixed(2));

/** A cell's error over seeds: "12.34 (11.90–13.02)", the median and the range. */
function spread(stats) {
  if (stats.median === null) return "–";
  const range = stats.min === stats.max ? "" : ` (${inPercent(stats.min)}–${inPercent(stats.max)})`;
  return inPercent(stats.median) + range;
}

function signed(x) {
  if (x === null || x === undefined) return "–";
  const text = (100 * Math.abs(x)).toFixed(2);
  return x < 0 ? `−${text}` : `+${text}`;
}

function jobLinks(jobs) {
  return h(
    "span.jobs",
    {},
    jobs.map((job) =>
      h(
        `a.status.${job.status}`,
        {
          href: `#/runs/${job.id}`,
          title: `${job.name ?? shortId(job.id)}: ${job.held ? "held for its turn" : job.status}`,
          dataset: { job: job.id },
        },
        job.name?.match(/seed \d+$/)?.[0] ?? shortId(job.id),
      ),
    ),
  );
}

function downloadLink(parts, path, filename, label) {
  return h(
    "a",
    {
      href: `${API}${path}`,
      download: filename,
      onclick: (event) => {
        event.preventDefault();
        save(path, filename).catch((error) =>
          parts.messages.replaceChildren(notice(error.message, true)),
        );
      },
    },
    label,
  );
}

// A search study's trials: the best trial and its spec, the best objective so far over
// trial number, a parallel-coordinates plot of the parameters against the objective (SVG),
// the parameters' importances as bars, the trials table (sortable) and job-seconds by status.

import { API, api, save } from "./api.js";
import { PALETTE, plot } from "./charts.js";
import { h, notice, seconds, shortId, statusBadge } from "./ui.js";

const SVG = "http://www.w3.org/2000/svg";
const BEST_COLOUR = [43, 89, 195]; // the accent: the best trials
const WORST_COLOUR = [240, 140, 0];

/** Whether the study is a search (its trials come from GET /studies/{id}/trials). */
export const isSearch = (study) => Boolean(study.spec?.search);

/** The search's part of the study page, in `card` (drawn again at each poll). */
export async function drawSearch(card, study, ctx) {
  const found = await api(`/studies/${study.id}/trials`, { signal: ctx.signal });
  if (!card.childElementCount) {
    card.append(
      h("h2", {}, "Search"),
      h("p.muted", { id: "search-summary" }),
      h("div.card", { id: "search-best" }),
      h("div.card", {}, h("div.chart", { id: "chart-best-so-far" })),
      h("div.card", { id: "chart-parallel" }),
      h("div.card", {}, h("div.chart", { id: "chart-importances" })),
      h("div.card", { id: "search-trials" }),
    );
  }
  const part = (id) => card.querySelector(`#${id}`);
  part("search-summary").textContent = summary(study, found);
  drawBest(part("search-best"), found);
  drawBestSoFar(part("chart-best-so-far"), found);
  part("chart-parallel").replaceChildren(
    found.parallel.lines.length
      ? parallelCoordinates(found)
      : h("p.muted", {}, "No trial has completed yet."),
  );
  drawImportances(part("chart-importances"), found);
  drawTrials(part("search-trials"), study, found);
}

const objectiveText = (x) => (x === null || x === undefined ? "–" : Number(x).toPrecision(4));
const paramText = (x) =>
  typeof x === "number" && !Number.isInteger(x)
    ? x.toPrecision(4)
    : typeof x === "object" && x !== null
      ? JSON.stringify(x)
      : String(x);

function summary(study, found) {
  const search = study.spec.search;
  const spent = found.job_seconds;
  const byStatus = Object.entries(spent.by_status)
    .map(([status, s]) => `${status} ${seconds(s)}`)
    .join(", ");
  const saved = spent.saved_by_pruning
    ? `; pruning saved about ${seconds(spent.saved_by_pruning)}`
    : "";
  return (
    `${found.method} search of ${search.trials ?? found.trials.length} trials, pruner ` +
    `${search.pruner ?? "none"}, ${found.direction} ${found.objective} · job-seconds ` +
    `${seconds(spent.total)} (${byStatus})${saved}`
  );
}

function drawBest(card, found) {
  const best = found.best;
  if (!best) {
    card.replaceChildren(h("p.muted", {}, "No trial has completed yet."));
    return;
  }
  card.replaceChildren(
    h(
      "p",
      {},
      h("strong", {}, `Best trial ${best.trial}: `),
      `${found.objective} `,
      h("span", { id: "search-best-value" }, objectiveText(best.value)),
      best.job_id ? [" · ", h("a", { href: `#/runs/${best.job_id}` }, shortId(best.job_id))] : null,
    ),
    h(
      "dl.facts",
      {},
      Object.entries(best.params).flatMap(([path, value]) => [
        h("dt", {}, path),
        h("dd", { dataset: { param: path } }, paramText(value)),
      ]),
    ),
    h(
      "details",
      {},
      h("summary", {}, "Its job's spec"),
      h("pre", {}, JSON.stringify(best.spec, null, 2)),
    ),
  );
}

function drawBestSoFar(div, found) {
  const points = found.best_so_far;
  const trials = points.map((p) => p.trial);
  plot(
    div,
    [
      {
        x: trials,
        y: points.map((p) => p.value),
        name: "trial",
        mode: "markers",
        marker: { color: PALETTE[4], size: 7 },
        meta: { part: "trials" },
      },
      {
        x: trials,
        y: points.map((p) => p.best),
        name: "best so far",
        mode: "lines",
        line: { color: PALETTE[0], width: 3, shape: "hv" },
        meta: { part: "best" },
      },
    ],
    {
      title: { text: `Best ${found.objective} so far, by trial` },
      xaxis: { title: { text: "trial" }, dtick: Math.max(1, Math.ceil((trials.at(-1) ?? 0) / 10)) },
      yaxis: { title: { text: found.objective } },
    },
  );
}

function drawImportances(div, found) {
  const entries = Object.entries(found.importances ?? {}).sort((a, b) => a[1] - b[1]);
  if (!entries.length) {
    div.replaceChildren(
      h("p.muted", {}, "Importances need 2 completed trials and 2 parameters or more."),
    );
    div.style.minHeight = "0";
    return;
  }
  const height = Math.max(200, 60 + 40 * entries.length);
  div.style.minHeight = `${height}px`;
  plot(
    div,
    [
      {
        type: "bar",
        orientation: "h",
        x: entries.map(([, share]) => share),
        y: entries.map(([path]) => path),
        marker: { color: PALETTE[0] },
        meta: { part: "importances" },
      },
    ],
    {
      title: { text: "Parameter importances (fANOVA)" },
      height,
      margin: { l: 180, r: 20, t: 36, b: 40 },
      xaxis: { range: [0, 1] },
    },
  );
}

/** One axis's position of a value in [0, 1]: by its range (log where drawn so), or its choice. */
function scaler(axis, values) {
  if (axis.choices) {
    const keys = axis.choices.map((c) => JSON.stringify(c));
    const last = Math.max(1, keys.length - 1);
    return {
      at: (v) => keys.indexOf(JSON.stringify(v)) / last,
      ticks: axis.choices.map(paramText),
    };
  }
  const numbers = values.filter((v) => typeof v === "number");
  let low = axis.low ?? Math.min(...numbers);
  let high = axis.high ?? Math.max(...numbers);
  const f = axis.log ? Math.log : (x) => x;
  if (!(f(high) > f(low))) [low, high] = [low - 1, high + 1];
  return {
    at: (v) => (f(v) - f(low)) / (f(high) - f(low)),
    ticks: [paramText(low), paramText(high)],
  };
}

const mix = (t) =>
  `rgb(${BEST_COLOUR.map((c, i) => Math.round(c + (WORST_COLOUR[i] - c) * t)).join(",")})`;

function svg(tag, attrs = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, value);
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) {
      element.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return element;
}

/**
 * Parallel coordinates: a vertical axis per parameter and one for the objective, a line per
 * completed trial through its values, coloured from the best (blue) to the worst (orange);
 * a pruned trial's line is grey and dashed, ending at its last evaluation's value.
 */
export function parallelCoordinates(found) {
  const { axes, lines, objective } = found.parallel;
  const width = 960;
  const height = 340;
  const [top, bottom, side] = [64, 40, 70];
  const values = lines.map((line) => line.value);
  const completed = lines.filter((line) => line.status !== "pruned").map((line) => line.value);
  const judged = completed.length ? completed : values;
  const objectiveAxis = { path: objective, low: null, high: null, log: false, choices: null };
  const all = [...axes, objectiveAxis];
  const scales = all.map((axis, i) =>
    scaler(axis, i < axes.length ? lines.map((line) => line.params[axis.path]) : values),
  );
  const x = (i) => side + (i * (width - 2 * side)) / Math.max(1, all.length - 1);
  const y = (t) => top + (1 - t) * (height - top - bottom);
  const worst = found.direction === "minimize" ? Math.max(...judged) : Math.min(...judged);
  const best = found.direction === "minimize" ? Math.min(...judged) : Math.max(...judged);
  const spread = worst - best || 1;
  // Pruned trials first (underneath), then the completed ones, the best drawn last.
  const rank = (line) => (line.status === "pruned" ? Infinity : Math.abs(line.value - best));
  const drawn = [...lines].sort((a, b) => rank(b) - rank(a));
  const polylines = drawn.map((line) => {
    const points = all.map((axis, i) => {
      const v = i < axes.length ? line.params[axis.path] : line.value;
      return `${x(i).toFixed(1)},${y(scales[i].at(v)).toFixed(1)}`;
    });
    const words = axes.map((axis) => `${axis.path}=${paramText(line.params[axis.path])}`);
    const pruned = line.status === "pruned";
    const look = pruned
      ? { stroke: "#9ca3af", "stroke-width": 1, "stroke-dasharray": "4 3", "stroke-opacity": 0.7 }
      : {
          stroke: mix((line.value - best) / spread),
          "stroke-width": line.value === best ? 3 : 1.5,
          "stroke-opacity": 0.85,
        };
    const when = pruned ? " at its last evaluation (pruned)" : "";
    return svg(
      "polyline",
      {
        points: points.join(" "),
        fill: "none",
        ...look,
        "data-trial": line.trial,
        "data-status": line.status,
      },
      svg(
        "title",
        {},
        `trial ${line.trial}: ${objective} ${objectiveText(line.value)}${when}; ${words.join(", ")}`,
      ),
    );
  });
  const axisMarks = all.map((axis, i) => {
    const ticks = scales[i].ticks;
    const isObjective = i === axes.length;
    const labels = axis.choices
      ? ticks.map((text, k) => [text, k / Math.max(1, ticks.length - 1)])
      : isObjective
        ? [
            [objectiveText(Math.min(...values)), 0],
            [objectiveText(Math.max(...values)), 1],
          ]
        : [
            [ticks[0], 0],
            [ticks[1], 1],
          ];
    return svg(
      "g",
      { class: "axis", "data-path": axis.path },
      svg("line", { x1: x(i), x2: x(i), y1: y(0), y2: y(1), stroke: "#6b7280" }),
      svg(
        "text",
        { x: x(i), y: top - 18, "text-anchor": "middle", "font-weight": isObjective ? 700 : 600 },
        axis.log ? `${axis.path} (log)` : axis.path,
      ),
      labels.map(([text, t]) =>
        svg("text", { x: x(i) + 5, y: y(t) + 4, "font-size": 11, fill: "#6b7280" }, text),
      ),
    );
  });
  return svg(
    "svg",
    {
      id: "parallel-coordinates",
      viewBox: `0 0 ${width} ${height}`,
      width: "100%",
      role: "img",
      "aria-label": `Parallel coordinates of ${lines.length} trials`,
      "font-size": 12,
    },
    svg(
      "text",
      { x: 8, y: 16, "font-weight": 600 },
      "Parameters against the objective (completed trials; pruned ones grey, dashed, at their last evaluation)",
    ),
    polylines,
    axisMarks,
  );
}

const COLUMNS = [
  ["trial", "trial", true],
  ["status", "status", false],
  ["value", "objective", true],
  ["best_value", "best", true],
  ["steps", "steps", true],
  ["job_seconds", "job time", true],
  ["pruned_at", "pruned at", true],
];

function drawTrials(card, study, found) {
  // The sort the user chose stays on the card, so a poll's redraw keeps it.
  const sort = { key: card.dataset.sort ?? "trial", descending: card.dataset.descending === "1" };
  const paths = Object.keys(study.spec.search.space);
  const key = (trial, column) => (paths.includes(column) ? trial.params[column] : trial[column]);
  const order = [...found.trials].sort((a, b) => {
    const [p, q] = [key(a, sort.key), key(b, sort.key)];
    if (p === q) return a.trial - b.trial;
    if (p === null || p === undefined) return 1; // no value: last, either way
    if (q === null || q === undefined) return -1;
    const less = typeof p === "number" && typeof q === "number" ? p < q : String(p) < String(q);
    return (less ? -1 : 1) * (sort.descending ? -1 : 1);
  });
  const header = (column, label, num) =>
    h(
      num ? "th.num.sortable" : "th.sortable",
      {
        dataset: { sort: column },
        title: "sort by this column",
        onclick: () => {
          card.dataset.descending = sort.key === column && !sort.descending ? "1" : "0";
          card.dataset.sort = column;
          drawTrials(card, study, found);
        },
      },
      label,
      sort.key === column ? (sort.descending ? " ▼" : " ▲") : "",
    );
  const [first, second, ...measures] = COLUMNS;
  const head = h(
    "tr",
    {},
    header(...first),
    header(...second),
    paths.map((path) => header(path, path, false)),
    measures.map((column) => header(...column)),
    h("th", {}, "job"),
  );
  const rows = order.map((trial) =>
    h(
      "tr",
      { dataset: { trial: trial.trial } },
      h("td.num", { dataset: { col: "trial" } }, String(trial.trial)),
      h("td", {}, statusBadge(trial.status)),
      paths.map((path) => h("td", { dataset: { col: path } }, paramText(trial.params[path]))),
      h("td.num", { dataset: { col: "value" } }, objectiveText(trial.value)),
      h("td.num", { dataset: { col: "best_value" } }, objectiveText(trial.best_value)),
      h("td.num", { dataset: { col: "steps" } }, String(trial.steps)),
      h("td.num", { dataset: { col: "job_seconds" } }, seconds(trial.job_seconds)),
      h("td.num", { dataset: { col: "pruned_at" } }, trial.pruned_at ?? "–"),
      h(
        "td",
        {},
        trial.job_id ? h("a", { href: `#/runs/${trial.job_id}` }, shortId(trial.job_id)) : "–",
      ),
    ),
  );
  const path = `/studies/${study.id}/trials.csv`;
  const filename = `study-${study.id}-trials.csv`;
  const download = h(
    "a",
    {
      href: `${API}${path}`,
      download: filename,
      onclick: (event) => {
        event.preventDefault();
        save(path, filename).catch((error) => card.append(notice(error.message, true)));
      },
    },
    "CSV",
  );
  card.replaceChildren(
    h("table", { id: "trials-table" }, h("thead", {}, head), h("tbody", {}, rows)),
    h("div.row", { id: "trials-downloads" }, "Download the trials: ", download),
  );
}

// Charts with plotly.js (served by the API from the plotly package): the papers' figures.

export const PALETTE = [
  "#2b59c3",
  "#d9480f",
  "#2f9e44",
  "#ae3ec9",
  "#343a40",
  "#1098ad",
  "#c2255c",
  "#5c940d",
  "#364fc7",
  "#862e9c",
];

const CONFIG = { displaylogo: false, responsive: true };

/** Draw (or redraw in place) a chart into `div`. */
export function plot(div, traces, layout) {
  const base = {
    margin: { l: 60, r: 20, t: 36, b: 46 },
    height: 320,
    legend: { orientation: "h", y: -0.25 },
    font: { size: 12 },
    paper_bgcolor: "#fff",
    plot_bgcolor: "#fff",
    xaxis: { gridcolor: "#eceff3", zeroline: false },
    yaxis: { gridcolor: "#eceff3", zeroline: false },
  };
  const merged = { ...base, ...layout };
  merged.xaxis = { ...base.xaxis, ...layout.xaxis };
  merged.yaxis = { ...base.yaxis, ...layout.yaxis };
  window.Plotly.react(div, traces, merged, CONFIG);
}

const asPercent = (values) => values.map((v) => 100 * v);

/**
 * Error curves as the 2015 paper draws them: training error thin, test error bold, in
 * one colour per run (validation error dashed).
 */
export function errorTraces(series, { color = PALETTE[0], label = "" } = {}) {
  const prefix = label ? `${label} ` : "";
  const traces = [];
  const add = (name, title, line) => {
    const s = series[name];
    if (!s?.steps.length) return;
    traces.push({
      x: s.steps,
      y: asPercent(s.values),
      name: `${prefix}${title}`,
      mode: "lines",
      line: { color, ...line },
      meta: { metric: name, run: label },
    });
  };
  add("train/error", "train error", { width: 1 });
  add("val/error", "val error", { width: 2, dash: "dot" });
  add("test/error", "test error", { width: 3 });
  return traces;
}

export const ERROR_LAYOUT = {
  title: { text: "Error (%) — training thin, test bold" },
  xaxis: { title: { text: "iterations" } },
  yaxis: { title: { text: "error (%)" }, rangemode: "tozero" },
};

/** Lines of the named series (loss, learning rate) against iterations. */
export function lineTraces(series, names) {
  return names
    .filter((n) => series[n]?.steps.length)
    .map((name, i) => ({
      x: series[name].steps,
      y: series[name].values,
      name,
      mode: "lines",
      line: { color: PALETTE[i], width: name.startsWith("train/") ? 1 : 2.5 },
    }));
}

/**
 * A per-block diagnostic (`diag/<kind>/<i>`) at its latest step, by block index (2015
 * Fig. 7 plots the response std by layer index, and again sorted by magnitude).
 */
export function perBlock(series, kind) {
  const prefix = `diag/${kind}/`;
  const blocks = Object.keys(series)
    .filter((n) => n.startsWith(prefix))
    .map((n) => [Number(n.slice(prefix.length)), series[n]])
    .filter(([, s]) => s.steps.length)
    .sort((a, b) => a[0] - b[0]);
  if (!blocks.length) return { traces: [], step: null };
  const step = Math.max(...blocks.map(([, s]) => s.steps[s.steps.length - 1]));
  const values = blocks.map(([, s]) => s.values[s.values.length - 1]);
  const index = blocks.map(([i]) => i);
  const traces = [
    {
      x: index,
      y: values,
      name: "by block index",
      mode: "lines+markers",
      line: { color: PALETTE[0], width: 2 },
    },
  ];
  if (kind === "response_std") {
    traces.push({
      x: index,
      y: [...values].sort((a, b) => b - a),
      name: "sorted by magnitude",
      mode: "lines",
      line: { color: PALETTE[1], width: 1.5, dash: "dot" },
    });
  }
  return { traces, step };
}

/** `color` (#rrggbb) at opacity `alpha`: the fill of a band. */
function translucent(color, alpha) {
  const [r, g, b] = [1, 3, 5].map((i) => Number.parseInt(color.slice(i, i + 2), 16));
  return `rgba(${r}, ${g}, ${b}, ${alpha})`;
}

const percentOrGap = (values) => values.map((v) => (v === null ? null : 100 * v));

/**
 * A study's curve of one cell over its seeds (`GET /studies/{id}/curves`): the median as a
 * line with the band (min-max over seeds) filled translucently around it, in panel `panel`
 * (1: x/y, 2: x2/y2). A curve of one point is a marker with the band as an error bar.
 */
export function bandTraces(curve, { name, color, line = {}, panel = 1, legend = true, meta = {} }) {
  if (!curve.steps.length) return [];
  const axes =
    panel === 1 ? { xaxis: "x", yaxis: "y" } : { xaxis: `x${panel}`, yaxis: `y${panel}` };
  const [x, center, lower, upper] = [
    curve.steps,
    percentOrGap(curve.center),
    percentOrGap(curve.lower),
    percentOrGap(curve.upper),
  ];
  const median = {
    x,
    y: center,
    name,
    legendgroup: meta.group ?? name,
    showlegend: legend,
    mode: "lines",
    line: { color, ...line },
    hovertemplate: `${name}: %{y:.2f}% at %{x}<extra></extra>`,
    meta: { ...meta, part: "median" },
    ...axes,
  };
  if (x.length === 1) {
    const error_y = {
      type: "data",
      symmetric: false,
      array: [upper[0] - center[0]],
      arrayminus: [center[0] - lower[0]],
      color,
    };
    return [{ ...median, mode: "markers", marker: { color, size: 8 }, error_y }];
  }
  const edge = (y, part, fill) => ({
    x,
    y,
    legendgroup: median.legendgroup,
    showlegend: false,
    mode: "lines",
    line: { color, width: 0 },
    fill,
    fillcolor: translucent(color, 0.15),
    hoverinfo: "skip",
    meta: { ...meta, part },
    ...axes,
  });
  // "tonexty" fills down to the trace just before: the lower edge, drawn first.
  return [edge(lower, "lower", "none"), edge(upper, "upper", "tonexty"), median];
}

/**
 * Error panels side by side (one per title, 2015 Fig. 6 has two), sharing the error axis:
 * iterations across, error (%) up.
 */
export function panelsLayout(titles, { title = "", height = 460 } = {}) {
  const gap = 0.06;
  const width = (1 - gap * (titles.length - 1)) / titles.length;
  const layout = {
    title: { text: title },
    height,
    margin: { l: 60, r: 20, t: titles.length > 1 ? 64 : 40, b: 46 },
    annotations: [],
  };
  titles.forEach((text, i) => {
    const suffix = i === 0 ? "" : String(i + 1);
    const left = i * (width + gap);
    layout[`xaxis${suffix}`] = {
      domain: [left, left + width],
      anchor: `y${suffix}`,
      title: { text: "iterations" },
      gridcolor: "#eceff3",
      zeroline: false,
    };
    layout[`yaxis${suffix}`] = {
      anchor: `x${suffix}`,
      rangemode: "tozero",
      gridcolor: "#eceff3",
      zeroline: false,
      ...(i === 0 ? { title: { text: "error (%)" } } : { matches: "y" }),
    };
    if (titles.length > 1) {
      layout.annotations.push({
        text: `<b>${text}</b>`,
        xref: "paper",
        yref: "paper",
        x: left + width / 2,
        y: 1,
        yanchor: "bottom",
        showarrow: false,
      });
    }
  });
  return layout;
}

/** One empty trace per panel: plotly draws a panel's axes only once a trace is on them. */
export function panelAnchors(count) {
  return Array.from({ length: count }, (_, i) => ({
    x: [],
    y: [],
    xaxis: i === 0 ? "x" : `x${i + 1}`,
    yaxis: i === 0 ? "y" : `y${i + 1}`,
    showlegend: false,
    hoverinfo: "skip",
    meta: { part: "panel", panel: i + 1 },
  }));
}

// Run detail: facts, live log and curves (Server-Sent Events), diagnostics, checkpoints,
// an evaluation's or a prediction's confusion matrix, and the run's actions.

import { api, follow, save } from "./api.js";
import { ERROR_LAYOUT, errorTraces, lineTraces, PALETTE, perBlock, plot } from "./charts.js";
import { noteCard } from "./notes.js";
import {
  ACTIVE,
  actionButton,
  duration,
  h,
  jobTitle,
  notice,
  number,
  percent,
  rate,
  statusBadge,
  when,
} from "./ui.js";

export async function render(view, ctx) {
  const id = ctx.id;
  let job = await api(`/jobs/${id}`, { signal: ctx.signal });
  const series = (await api(`/jobs/${id}/metrics?max_points=2000`, { signal: ctx.signal })).series;
  const parts = {
    header: h("div"),
    facts: h("div.card"),
    record: h("div.card", { id: "run-record" }),
    messages: h("div"),
    charts: h("div.grid"),
    checkpoints: h("div.card"),
    log: h("pre.log", { id: "log" }),
    spec: h("pre"),
  };
  view.append(
    parts.header,
    parts.messages,
    parts.facts,
    h("h2", {}, "Data and environment"),
    parts.record,
    noteCard(job, ctx.can("train")),
    parts.charts,
    h("h2", {}, "Checkpoints"),
    parts.checkpoints,
    h("h2", {}, "Log"),
    parts.log,
    h("h2", {}, "Spec"),
    parts.spec,
  );
  parts.spec.textContent = JSON.stringify(job.spec, null, 2);
  const charts = chartDivs(parts.charts, job);
  const redraw = throttle(() => drawCharts(charts, job, series));
  const refresh = async () => {
    job = await api(`/jobs/${id}`, { signal: ctx.signal });
    drawHeader(parts, job, ctx, refresh);
    drawFacts(parts.facts, job);
    drawRecord(parts.record, job);
    drawCheckpoints(
      parts.checkpoints,
      await api(`/jobs/${id}/checkpoints`, { signal: ctx.signal }),
    );
  };
  drawHeader(parts, job, ctx, refresh);
  drawFacts(parts.facts, job);
  drawRecord(parts.record, job);
  drawCharts(charts, job, series);
  drawCheckpoints(parts.checkpoints, await api(`/jobs/${id}/checkpoints`, { signal: ctx.signal }));
  const lastStep = Math.max(
    0,
    ...Object.values(series).map((s) => s.steps[s.steps.length - 1] ?? 0),
  );
  follow(
    id,
    lastStep + 1,
    {
      log: (line) => {
        parts.log.append(
          `${new Date(line.created_at).toLocaleTimeString()} ${line.level.padEnd(7)} ${line.message}\n`,
        );
        parts.log.scrollTop = parts.log.scrollHeight;
      },
      metrics: (data) => {
        // Counted where tests (and the curious) can see that points arrive live.
        view.dataset.liveMetrics = String(Number(view.dataset.liveMetrics ?? 0) + 1);
        for (const [name, s] of Object.entries(data.series)) {
          series[name] ??= { steps: [], values: [] };
          series[name].steps.push(...s.steps);
          series[name].values.push(...s.values);
        }
        redraw();
      },
      status: (state) => {
        Object.assign(job, {
          status: state.status,
          attempt: state.attempt,
          error: state.error,
          cancel_requested: state.cancel_requested,
        });
        drawHeader(parts, job, ctx, refresh);
        drawFacts(parts.facts, job);
      },
      progress: (state) => {
        job.progress = { step: state.step, total_steps: state.total_steps };
        drawFacts(parts.facts, job);
      },
      end: async () => {
        await refresh();
        const final = await api(`/jobs/${id}/metrics?max_points=2000`, { signal: ctx.signal });
        Object.assign(series, final.series);
        drawCharts(charts, job, series);
      },
    },
    ctx.signal,
  ).catch((error) => {
    if (!ctx.signal.aborted)
      parts.messages.replaceChildren(notice(`live updates stopped: ${error.message}`, true));
  });
}

function throttle(draw) {
  let queued = false;
  return () => {
    if (queued) return;
    queued = true;
    setTimeout(() => {
      queued = false;
      draw();
    }, 250);
  };
}

function drawHeader(parts, job, ctx, refresh) {
  const act = (label, action, cls) => actionButton(parts.messages, label, action, cls);
  const buttons = [];
  const canTrain = ctx.can("train");
  if (canTrain && ACTIVE.has(job.status) && !job.cancel_requested) {
    buttons.push(
      act("Cancel", async () => {
        await api(`/jobs/${job.id}/cancel`, { method: "POST" });
        await refresh();
        return "Cancel requested.";
      }),
    );
  }
  if (canTrain && job.kind === "train" && job.status === "succeeded") {
    buttons.push(
      act("Evaluate", async () => {
        const view = window.prompt(
          "Evaluate the best checkpoint with the view (center, ten_crop, multi_scale):",
          "center",
        );
        if (!view) return null;
        const spec = {
          kind: "evaluate",
          source_job: job.id,
          checkpoint: "best",
          dataset: job.spec.dataset,
          view: view.trim(),
        };
        const created = await api("/jobs", { method: "POST", body: spec });
        ctx.navigate(`#/runs/${created.id}`);
      }),
    );
    buttons.push(
      act("Register", async () => {
        const name = window.prompt(
          "Register the best checkpoint as a version of model:",
          job.model ?? "",
        );
        if (!name) return null;
        const version = await api(`/registry/${encodeURIComponent(name)}/versions`, {
          method: "POST",
          body: { job: job.id, checkpoint: "best" },
        });
        return `Registered as ${name} version ${version?.version ?? "?"}.`;
      }),
    );
  }
  if (canTrain && !ACTIVE.has(job.status)) {
    buttons.push(
      act(
        "Delete",
        async () => {
          if (!window.confirm(`Delete run ${jobTitle(job)}, its metrics and its files?`))
            return null;
          await api(`/jobs/${job.id}`, { method: "DELETE" });
          ctx.navigate("#/runs");
          return null;
        },
        "button.danger",
      ),
    );
  }
  parts.header.replaceChildren(
    h("h1", {}, jobTitle(job), " ", statusBadge(job.status)),
    h("div.row", { id: "actions" }, buttons),
  );
}

function drawFacts(card, job) {
  const { step, total_steps: total } = job.progress;
  const fraction = total ? step / total : 0;
  let facts = [
    ["id", job.id],
    ["kind", job.kind],
    ["status", job.status + (job.cancel_requested ? " (cancel requested)" : "")],
    ["model", job.model ?? "–"],
    ["dataset", job.dataset ?? "–"],
    ["params", number(job.results.params)],
    ["MACs / image", number(job.results.macs)],
    (job.kind === "train" || job.kind === "predict") && [
      "progress",
      h(
        "span.row",
        {},
        h("span.progress", {}, h("div", { style: `width:${100 * fraction}%` })),
        `${number(step)} / ${total ? number(total) : "?"} ${job.kind === "train" ? "iterations" : "images"}`,
      ),
    ],
    ["attempt", `${job.attempt} of ${job.max_attempts}`],
    ["needs", needs(job)],
    job.waiting_for && ["waiting for", h("span", { id: "waiting-for" }, job.waiting_for)],
    ["worker", job.worker ?? "–"],
    ["device", job.device ?? "–"],
    ["created", when(job.created_at)],
    ["started", when(job.started_at)],
    ["finished", when(job.finished_at)],
    ["duration", duration(job)],
    ["images/s", rate(job.results.images_per_s)],
    ["best test error", percent(job.results.best_test_error)],
    ["final test error", percent(job.results.final_test_error)],
  ];
  facts = facts.filter(Boolean);
  const summary = job.summary ?? {};
  if (job.kind === "evaluate" && summary.confusion) {
    facts.push(
      ["images", number(summary.count)],
      ["error", percent(summary.error)],
      ["top-5 error", percent(summary.top5_error)],
      ["loss", summary.loss?.toFixed(4) ?? "–"],
      ["ECE (15 bins)", h("span", { id: "ece" }, summary.ece?.toFixed(4) ?? "–")],
    );
  }
  if (job.kind === "predict" && summary.model) {
    const pinned = summary.model;
    const named = pinned.model ? `${pinned.model}/${pinned.version}` : `job ${pinned.job_id}`;
    facts.push(
      ["model ref", `${pinned.ref} → ${named}, step ${pinned.step}`],
      ["images", number(summary.images)],
      ["error", percent(summary.error)],
      [`top-${summary.top_k} error`, percent(summary.top_k_error)],
      [
        "files",
        h(
          "span",
          { id: "artifacts" },
          (summary.artifacts ?? []).flatMap((a, i) => [
            i ? ", " : "",
            h(
              "a",
              {
                href: "#",
                dataset: { artifact: a.name },
                title: `sha256 ${a.sha256}`,
                onclick: (e) => {
                  e.preventDefault();
                  save(`/jobs/${job.id}/artifacts/${encodeURIComponent(a.name)}`, a.name);
                },
              },
              a.name,
            ),
            ` (${number(a.bytes)} bytes)`,
          ]),
        ),
      ],
    );
  }
  if (job.source_job)
    facts.splice(1, 0, [
      "source run",
      h("a", { href: `#/runs/${job.source_job}` }, job.source_job),
    ]);
  if (job.tags.length) facts.push(["tags", job.tags.join(", ")]);
  if (job.error) facts.push(["error", h("span.error", {}, job.error)]);
  card.replaceChildren(
    h(
      "dl.facts",
      { id: "facts" },
      facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
    ),
  );
}

/** What the run read (digest, source, classes, splits, skipped files) and ran on
 * (versions, device): the row's record, written once its data is loaded. */
function drawRecord(card, job) {
  const data = job.data ?? job.summary?.data;
  const env = job.environment ?? job.summary?.environment;
  if (!data && !env) {
    card.replaceChildren(h("p.muted", {}, "Recorded once a worker has loaded the run's data."));
    return;
  }
  const digest = job.data_digest ?? data?.digest;
  const runsOf = `#/runs?filter=${encodeURIComponent(`data_digest=${digest}`)}`;
  const splits = Object.entries(data?.splits ?? {}).map(([k, n]) => `${k} ${number(n)}`);
  const skipped = data?.skipped ?? [];
  const classes = data?.classes ?? [];
  const facts = [
    digest && [
      "data digest",
      h("a", { id: "data-digest", href: runsOf, title: "every run of this data" }, digest),
    ],
    data?.source && ["source", data.source],
    classes.length && [
      "classes",
      `${classes.length}: ${classes.slice(0, 20).join(", ")}${classes.length > 20 ? ", …" : ""}`,
    ],
    splits.length && ["splits", h("span", { id: "data-splits" }, splits.join(" · "))],
    data && [
      "skipped files",
      skipped.length
        ? h(
            "span",
            { id: "data-skipped" },
            `${number(data.skipped_count ?? skipped.length)}: `,
            skipped.map((s) => `${s.file} (${s.error})`).join(", "),
          )
        : "none",
    ],
    env && [
      "software",
      h(
        "span",
        { id: "environment" },
        [
          `resnet-service ${env.service ?? "?"}`,
          env.git_commit
            ? `(${env.git_commit.slice(0, 12)}${env.git_commit.endsWith("+dirty") ? "+dirty" : ""})`
            : "",
          `· Python ${env.python} · torch ${env.torch} · torchvision ${env.torchvision}`,
          `· CUDA ${env.cuda ?? "–"} · cuDNN ${env.cudnn ?? "–"}`,
        ].join(" "),
      ),
    ],
    env && ["ran on", `${env.device ?? "?"} (${env.device_type}, ${env.device_count} seen)`],
    env?.os && ["host", `${env.host ?? ""} ${env.os}`.trim()],
  ].filter(Boolean);
  card.replaceChildren(
    h(
      "dl.facts",
      {},
      facts.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
    ),
  );
}

/** What the job asks of a worker (its spec's resources) and the queue that carries it. */
function needs(job) {
  const asked = job.spec.resources;
  if (!asked) return `any device · queue ${job.queue}`;
  const gpus = asked.gpus ? ` · ${asked.gpus} GPU${asked.gpus > 1 ? "s" : ""}` : "";
  return `${asked.device}${gpus} · queue ${job.queue}`;
}

function chartDivs(grid, job) {
  const names =
    job.kind === "evaluate" || job.kind === "predict"
      ? ["confusion", "per-class"]
      : ["error", "loss", "lr", "response-std", "grad-norm"];
  const divs = {};
  for (const name of names) {
    divs[name] = h("div.chart", { id: `chart-${name}` });
    grid.append(h("div.card", {}, divs[name]));
  }
  return divs;
}

function drawCharts(charts, job, series) {
  if (job.kind === "evaluate") {
    drawEvaluation(charts, job.summary);
    return;
  }
  if (job.kind === "predict") {
    drawPrediction(charts, job).catch((error) =>
      plot(charts.confusion, [], { title: { text: `No confusion matrix: ${error.message}` } }),
    );
    return;
  }
  plot(charts.error, errorTraces(series), ERROR_LAYOUT);
  plot(charts.loss, lineTraces(series, ["train/loss", "val/loss", "test/loss"]), {
    title: { text: "Loss" },
    xaxis: { title: { text: "iterations" } },
    yaxis: { title: { text: "loss" } },
  });
  plot(charts.lr, lineTraces(series, ["lr"]), {
    title: { text: "Learning rate" },
    xaxis: { title: { text: "iterations" } },
    yaxis: { title: { text: "lr" }, type: "log" },
    showlegend: false,
  });
  const response = perBlock(series, "response_std");
  plot(charts["response-std"], response.traces, {
    title: {
      text: `Response std by block (2015 Fig. 7)${response.step ? `, iteration ${response.step}` : ""}`,
    },
    xaxis: { title: { text: "block index" } },
    yaxis: { title: { text: "std" } },
  });
  const grads = perBlock(series, "grad_norm");
  plot(charts["grad-norm"], grads.traces, {
    title: { text: `Gradient norm by block${grads.step ? `, iteration ${grads.step}` : ""}` },
    xaxis: { title: { text: "block index" } },
    yaxis: { title: { text: "‖grad‖" }, type: "log" },
    showlegend: false,
  });
}

/** A prediction's confusion matrix, from the `confusion.json` its job wrote. */
async function drawPrediction(charts, job) {
  const written = (job.summary?.artifacts ?? []).some((a) => a.name === "confusion.json");
  if (!written) {
    const why = job.summary?.artifacts
      ? "No confusion matrix: the dataset's classes are not the model's"
      : "The confusion matrix appears when the prediction ends";
    drawEvaluation(charts, null, why);
    return;
  }
  const { classes, matrix } = await api(`/jobs/${job.id}/artifacts/confusion.json`);
  const total = (row) => row.reduce((a, b) => a + b, 0);
  const accuracy = matrix.map((row, i) => row[i] / Math.max(1, total(row)));
  drawEvaluation(charts, { confusion: matrix, classes, per_class_accuracy: accuracy });
}

function drawEvaluation(
  charts,
  summary,
  waiting = "The confusion matrix appears when the evaluation ends",
) {
  if (!summary?.confusion) {
    plot(charts.confusion, [], { title: { text: waiting } });
    return;
  }
  const classes = summary.classes ?? summary.confusion.map((_, i) => String(i));
  plot(
    charts.confusion,
    [
      {
        type: "heatmap",
        z: summary.confusion,
        x: classes,
        y: classes,
        colorscale: "Blues",
        reversescale: true,
        hovertemplate: "true %{y}, predicted %{x}: %{z}<extra></extra>",
      },
    ],
    {
      title: {
        text: `Confusion matrix${summary.view ? ` · ${summary.view} view` : ""}${summary.ece !== undefined ? ` · ECE ${summary.ece.toFixed(4)}` : ""}`,
      },
      height: 420,
      xaxis: { title: { text: "predicted" }, type: "category" },
      yaxis: { title: { text: "true" }, type: "category", autorange: "reversed" },
    },
  );
  const accuracy = summary.per_class_accuracy ?? [];
  plot(
    charts["per-class"],
    [
      {
        type: "bar",
        x: classes,
        y: accuracy.map((a) => 100 * a),
        marker: { color: PALETTE[0] },
      },
    ],
    {
      title: { text: "Per-class accuracy (%)" },
      height: 420,
      xaxis: { title: { text: "class" }, type: "category" },
      yaxis: { range: [0, 100] },
    },
  );
}

function drawCheckpoints(card, checkpoints) {
  if (!checkpoints.length) {
    card.replaceChildren(
      h("p.muted", {}, "No checkpoints (evaluations keep none; training saves one per epoch)."),
    );
    return;
  }
  const rows = checkpoints.map((c) =>
    h(
      "tr",
      {},
      h("td.num", {}, number(c.step)),
      h("td.num", {}, c.epoch),
      h("td", {}, c.is_best ? "best" : ""),
      h("td.num", {}, `${(c.bytes / 1e6).toFixed(2)} MB`),
      h("td", { title: c.sha256 }, c.sha256.slice(0, 12)),
      h(
        "td",
        {},
        c.metrics
          ? Object.entries(c.metrics)
              .map(([k, v]) => `${k} ${typeof v === "number" ? v.toFixed(4) : v}`)
              .join(" · ")
          : "",
      ),
      h("td", {}, when(c.created_at)),
    ),
  );
  card.replaceChildren(
    h(
      "table",
      { id: "checkpoints" },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ["step", "epoch", "", "size", "sha256", "metrics", "saved"].map((t) => h("th", {}, t)),
        ),
      ),
      h("tbody", {}, rows),
    ),
  );
}

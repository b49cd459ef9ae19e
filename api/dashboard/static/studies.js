// Studies: the list with each study's state and progress (live while one is unfinished), and
// the new-study form: a preset of the papers on a dataset, checked and counted by a dry run
// on every change before it is submitted.

import { ApiError, api } from "./api.js";
import { cellLabel, studyTitle } from "./study.js";
import { ACTIVE, h, notice, statusBadge, when } from "./ui.js";

const POLL_MS = 2000;
const DRY_RUN_DELAY_MS = 200; // typing a number asks once, not once per keystroke

export async function render(view, ctx) {
  const table = h("table", { id: "studies" });
  const newButton = ctx.can("train")
    ? h("button", { id: "new-study", onclick: () => ctx.navigate("#/studies/new") }, "New study")
    : null;
  view.append(h("div.row.spread", {}, h("h1", {}, "Studies"), newButton), h("div.card", {}, table));
  let timer = null;
  const load = async () => {
    clearTimeout(timer);
    let studies;
    try {
      studies = await api("/studies", { signal: ctx.signal });
    } catch (error) {
      if (ctx.signal.aborted) return;
      table.replaceChildren(h("caption.error", {}, error.message));
      return;
    }
    drawList(table, studies);
    if (studies.some((study) => ACTIVE.has(study.state)) && !ctx.signal.aborted) {
      timer = setTimeout(load, POLL_MS);
    }
  };
  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  await load();
}

function drawList(table, studies) {
  const head = h(
    "tr",
    {},
    ["study", "preset", "scale", "state", "progress", "created"].map((label) => h("th", {}, label)),
  );
  const rows = studies.map((study) => {
    const { done, total } = study.counts;
    return h(
      "tr",
      { dataset: { id: study.id } },
      h(
        "td",
        {},
        h("a", { href: `#/studies/${study.id}` }, studyTitle(study)),
        study.tags.map((t) => h("span.tag", {}, t)),
      ),
      h("td", {}, study.preset ?? "custom"),
      h("td", {}, study.scale ?? "–"),
      h("td", {}, statusBadge(study.state)),
      h(
        "td",
        {},
        h(
          "span.row",
          {},
          h("span.progress", {}, h("div", { style: `width:${total ? (100 * done) / total : 0}%` })),
          h("span.done", {}, `${done} / ${total}`),
        ),
      ),
      h("td", {}, when(study.created_at)),
    );
  });
  const body = rows.length ? rows : [h("tr", {}, h("td.muted", { colSpan: 6 }, "No studies yet."))];
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, body));
}

/** `#/studies/new`: a preset on a dataset at a scale, with its seeds. */
export const newStudy = { render: renderNew };

async function renderNew(view, ctx) {
  const [presets, datasets] = await Promise.all([
    api("/studies/presets", { signal: ctx.signal }),
    api("/datasets", { signal: ctx.signal }),
  ]);
  const labels = Object.fromEntries(
    datasets.map((d) => [d.name, d.available ? d.name : `${d.name} (not here)`]),
  );
  const about = h("div.card", { id: "preset-about" });
  const preview = h("div", { id: "study-preview" });
  const submitButton = h("button", { type: "submit", id: "submit-study" }, "Submit study");
  const form = h(
    "form",
    { id: "new-study", novalidate: true },
    h(
      "fieldset",
      {},
      h("legend", {}, "Study"),
      h(
        "div.row",
        {},
        field(
          "preset",
          select(
            "preset",
            presets.map((p) => p.name),
            Object.fromEntries(presets.map((p) => [p.name, `${p.name}: ${p.title}`])),
          ),
        ),
        field(
          "dataset",
          select(
            "dataset",
            datasets.map((d) => d.name),
            labels,
          ),
        ),
        field(
          "path (under the data root)",
          h("input", { name: "path", autocomplete: "off", placeholder: "uploads/…" }),
          "path",
        ),
        field("scale", select("scale", ["quick", "paper"])),
        field("seeds", h("input", { name: "seeds", type: "number", min: 1, value: 3 })),
        field(
          "max parallel",
          h("input", { name: "max_parallel", type: "number", min: 1, value: 2 }),
        ),
        field(
          "name",
          h("input", { name: "name", autocomplete: "off", placeholder: "the preset's" }),
        ),
      ),
    ),
    about,
    preview,
    submitButton,
  );
  const chosen = () => presets.find((p) => p.name === form.elements.preset.value);
  const showAbout = () => {
    const preset = chosen();
    const scale = form.elements.scale.value;
    about.replaceChildren(
      h("h2", {}, preset.title),
      h("p", {}, h("strong", {}, "Source: "), preset.source),
      h("p", {}, preset.description),
      h("p", { id: "preset-recipe" }, h("strong", {}, `Recipe (${scale}): `), preset.recipe[scale]),
      h("p.muted", {}, preset.note),
    );
  };
  const showPath = () =>
    form
      .querySelector("[data-field=path]")
      .classList.toggle("hidden", form.elements.dataset.value !== "imagefolder");
  const check = dryRun(form, preview, submitButton, ctx);
  form.elements.preset.addEventListener("change", () => {
    form.elements.dataset.value = chosen().quick_datasets[0] ?? form.elements.dataset.value;
  });
  const changed = () => {
    showAbout();
    showPath();
    check();
  };
  form.addEventListener("input", changed);
  form.addEventListener("change", changed);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    submitButton.disabled = true;
    try {
      const created = await api("/studies", { method: "POST", body: request(form) });
      ctx.navigate(`#/studies/${created.id}`);
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      preview.replaceChildren(notice(error.message, true));
      submitButton.disabled = false;
    }
  });
  view.append(h("h1", {}, "New study"), form);
  form.elements.dataset.value = chosen().quick_datasets[0] ?? datasets[0]?.name;
  changed();
}

function field(label, input, name = input.name) {
  return h("label", { dataset: { field: name } }, label, input);
}

function select(name, values, labels = {}) {
  return h(
    "select",
    { name },
    values.map((v) => h("option", { value: v }, labels[v] ?? v)),
  );
}

/** The study the form describes, as `POST /studies` takes it. */
function request(form) {
  const values = Object.fromEntries(new FormData(form).entries());
  const dataset = { name: values.dataset };
  if (values.dataset === "imagefolder" && values.path.trim()) dataset.path = values.path.trim();
  const body = {
    preset: values.preset,
    dataset,
    scale: values.scale,
    seeds: Number(values.seeds),
    max_parallel: Number(values.max_parallel),
  };
  if (values.name.trim()) body.name = values.name.trim();
  return body;
}

/**
 * A checker that dry-runs the form's study (after a short pause, the newest request only)
 * and shows its size, "N cells × S seeds = J jobs", or why the API refuses it.
 */
function dryRun(form, preview, submitButton, ctx) {
  let timer = null;
  let pending = null;
  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  const run = async () => {
    pending?.abort();
    const controller = new AbortController();
    pending = controller;
    const signal = AbortSignal.any([ctx.signal, controller.signal]);
    try {
      const answer = await api("/studies?dry_run=true", {
        method: "POST",
        body: request(form),
        signal,
      });
      showPreview(preview, answer);
      submitButton.disabled = false;
    } catch (error) {
      if (signal.aborted) return;
      preview.replaceChildren(
        h("div.notice.bad", { id: "study-error", role: "alert" }, error.message),
      );
      submitButton.disabled = true;
    }
  };
  return () => {
    clearTimeout(timer);
    submitButton.disabled = true;
    timer = setTimeout(run, DRY_RUN_DELAY_MS);
  };
}

function showPreview(preview, answer) {
  const cells = answer.cells.length;
  const seeds = answer.seeds.length;
  const paper = (cell) => (cell.paper === null ? "" : ` (paper ${(100 * cell.paper).toFixed(2)}%)`);
  preview.replaceChildren(
    h(
      "p",
      { id: "study-count" },
      h("strong", {}, `${cells} cells × ${seeds} seeds = ${answer.jobs} jobs`),
      answer.name ? h("span.muted", {}, ` · ${answer.name}`) : null,
    ),
    h(
      "p.cells",
      {},
      answer.cells.map((cell) => h("span.tag", {}, cellLabel(cell.values) + paper(cell))),
    ),
  );
}

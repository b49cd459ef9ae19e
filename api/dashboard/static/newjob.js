// New job: a form built from the API's zoo and dataset lists; POST /api/v1/jobs, with each
// 422 detail shown next to the field its `loc` names.

import { ApiError, api } from "./api.js";
import { h, notice } from "./ui.js";

// The options of models.build (README "The model zoo"); "" leaves the net's default.
const OPTIONS = {
  block: ["basic", "bottleneck"],
  unit: ["original", "bn_after_add", "relu_before_add", "relu_only_preact", "full_preact"],
  shortcut: ["A", "B", "C"],
  shortcut_variant: ["identity", "constant_scaling", "exclusive_gating", "shortcut_only_gating",
    "conv1x1", "dropout"],
};
// Which options a family has: plain nets have no shortcuts to choose.
const FAMILY_OPTIONS = {
  plain: ["block", "unit"],
  resnet: ["block", "unit", "shortcut", "shortcut_variant"],
  preact_resnet: ["block", "unit", "shortcut", "shortcut_variant"],
};
// Numeric options that only mean something for one shortcut variant.
const VARIANT_OPTIONS = {
  constant_scaling: ["shortcut_scale", "residual_scale"],
  exclusive_gating: ["gate_bias"],
  shortcut_only_gating: ["gate_bias"],
  dropout: ["shortcut_dropout"],
};

export async function render(view, ctx) {
  const [zoo, datasets] = await Promise.all([
    api("/api/v1/models", { signal: ctx.signal }),
    api("/api/v1/datasets", { signal: ctx.signal }),
  ]);
  const families = [...new Set(zoo.map((m) => m.family))];
  const general = h("div");
  const form = h("form", { id: "new-job", novalidate: true });
  const field = (loc, label, input, hint) => h("label", { dataset: { loc } }, label, input,
    hint ? h("span.muted", {}, hint) : null, h("span.field-error"));
  const text = (name, attrs = {}) => h("input", { name, autocomplete: "off", ...attrs });
  const select = (name, values, labels = {}) => h("select", { name },
    values.map((v) => h("option", { value: v }, labels[v] ?? (v === "" ? "default" : v))));

  const family = select("family", families);
  const modelName = text("model", { list: "zoo-names", required: true, placeholder: "resnet20" });
  const names = h("datalist", { id: "zoo-names" });
  const optionFields = Object.fromEntries(Object.entries(OPTIONS).map(([name, values]) =>
    [name, field(`model.options.${name}`, name, select(`option.${name}`, ["", ...values]))]));
  const numericOptions = Object.fromEntries(["shortcut_scale", "residual_scale", "gate_bias", "shortcut_dropout"]
    .map((name) => [name, field(`model.options.${name}`, name, text(`option.${name}`, { type: "number", step: "any" }))]));
  const showOptions = () => {
    const allowed = FAMILY_OPTIONS[family.value] ?? Object.keys(OPTIONS);
    for (const [name, wrapper] of Object.entries(optionFields)) wrapper.classList.toggle("hidden", !allowed.includes(name));
    const variant = allowed.includes("shortcut_variant") ? form.elements["option.shortcut_variant"].value : "";
    const numeric = VARIANT_OPTIONS[variant] ?? [];
    for (const [name, wrapper] of Object.entries(numericOptions)) wrapper.classList.toggle("hidden", !numeric.includes(name));
    const inFamily = zoo.filter((m) => m.family === family.value);
    names.replaceChildren(...inFamily.map((m) => h("option", { value: m.name }, `${m.depth} layers · ${(m.params / 1e6).toFixed(2)}M params`)));
    if (!modelName.value || !zoo.some((m) => m.name === modelName.value && m.family === family.value)) {
      modelName.placeholder = inFamily[0]?.name ?? "";
    }
  };
  family.addEventListener("change", showOptions);

  const dataset = select("dataset", datasets.map((d) => d.name),
    Object.fromEntries(datasets.map((d) => [d.name, d.available ? d.name : `${d.name} (not here)`])));
  const datasetPath = field("dataset.path", "path (under the data root)", text("dataset.path", { placeholder: "uploads/…" }));
  const showDataset = () => datasetPath.classList.toggle("hidden", dataset.value !== "imagefolder");
  dataset.addEventListener("change", showDataset);
  const firstAvailable = datasets.find((d) => d.available);
  if (firstAvailable) dataset.value = firstAvailable.name;

  const budgetUnit = select("budget", ["epochs", "iterations"]);
  const budget = field("recipe.epochs", "budget", h("span.row", {}, text("budget_value", { type: "number", min: 0, step: "any", placeholder: "64000 iterations (paper)" }), budgetUnit));
  budgetUnit.addEventListener("change", () => { budget.dataset.loc = `recipe.${budgetUnit.value}`; });
  const number = (name, placeholder) => field(`recipe.${name}`, name, text(`recipe.${name}`, { type: "number", step: "any", placeholder }));

  form.append(
    h("fieldset", {}, h("legend", {}, "Run"), h("div.row", {},
      field("name", "name", text("name", { placeholder: "resnet56 baseline" })),
      field("tags", "tags (comma-separated)", text("tags", { placeholder: "paper, fig6" })))),
    h("fieldset", { dataset: { loc: "model" } }, h("legend", {}, "Model"), h("div.row", {},
      field("family", "family", family), field("model.name", "model", modelName, "any depth, e.g. resnet8"), names,
      Object.values(optionFields), Object.values(numericOptions),
      h("label.check", { dataset: { loc: "model.options.zero_init_residual" } },
        h("input", { type: "checkbox", name: "option.zero_init_residual" }), "zero-init residual"))),
    h("fieldset", { dataset: { loc: "dataset" } }, h("legend", {}, "Dataset"), h("div.row", {},
      field("dataset.name", "dataset", dataset), datasetPath,
      field("dataset.validation", "validation fraction", text("dataset.validation", { type: "number", step: "any", placeholder: "0.1" })),
      field("dataset.train_limit", "train limit", text("dataset.train_limit", { type: "number", placeholder: "all" })))),
    h("fieldset", { dataset: { loc: "recipe" } }, h("legend", {}, "Recipe (empty: the paper's)"), h("div.row", {},
      budget, number("batch_size", "128"), number("lr", "0.1"), number("momentum", "0.9"),
      number("weight_decay", "0.0001"),
      field("recipe.optimizer", "optimizer", select("recipe.optimizer", ["", "sgd", "nesterov", "adamw"])),
      field("recipe.schedule", "schedule", select("recipe.schedule", ["", "multistep", "cosine", "onecycle", "constant"])),
      field("recipe.warmup", "warm-up", select("recipe.warmup", ["", "auto", "off", "paper", "linear"])),
      field("recipe.augment", "augment", select("recipe.augment", ["", "true", "false"])),
      number("log_every", "50"), number("seed", "0"))),
    general,
    h("button", { type: "submit", id: "submit-job" }, "Submit job"));
  form.elements["option.shortcut_variant"].addEventListener("change", showOptions);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(form, general, ctx);
  });
  view.append(h("h1", {}, "New job"), form);
  showOptions();
  showDataset();
}

function spec(form) {
  const values = Object.fromEntries(new FormData(form).entries());
  const num = (v) => (v === undefined || v === "" ? undefined : Number(v));
  const options = {};
  for (const [key, value] of Object.entries(values)) {
    if (!key.startsWith("option.") || value === "") continue;
    const wrapper = form.querySelector(`[name="${key}"]`).closest("label");
    if (wrapper.classList.contains("hidden")) continue;
    const name = key.slice("option.".length);
    options[name] = name === "zero_init_residual" ? true : (OPTIONS[name] ? value : Number(value));
  }
  const recipe = {};
  if (values.budget_value) recipe[values.budget] = num(values.budget_value);
  for (const name of ["batch_size", "lr", "momentum", "weight_decay", "log_every", "seed"]) {
    if (values[`recipe.${name}`] !== "") recipe[name] = num(values[`recipe.${name}`]);
  }
  for (const name of ["optimizer", "schedule", "warmup"]) {
    if (values[`recipe.${name}`]) recipe[name] = values[`recipe.${name}`];
  }
  if (values["recipe.augment"]) recipe.augment = values["recipe.augment"] === "true";
  const dataset = { name: values.dataset };
  if (values.dataset === "imagefolder") dataset.path = values["dataset.path"];
  if (values["dataset.validation"] !== "") dataset.validation = num(values["dataset.validation"]);
  if (values["dataset.train_limit"] !== "") dataset.train_limit = num(values["dataset.train_limit"]);
  const job = {
    kind: "train",
    model: { name: values.model.trim() || form.elements.model.placeholder, options },
    dataset,
    recipe,
  };
  if (values.name.trim()) job.name = values.name.trim();
  const tags = values.tags.split(",").map((t) => t.trim()).filter(Boolean);
  if (tags.length) job.tags = tags;
  return job;
}

async function submit(form, general, ctx) {
  for (const error of form.querySelectorAll(".field-error")) error.textContent = "";
  general.replaceChildren();
  const button = form.querySelector("#submit-job");
  button.disabled = true;
  try {
    const job = await api("/api/v1/jobs", { method: "POST", body: spec(form) });
    ctx.navigate(`#/runs?new=${job.id}`);
  } catch (error) {
    if (!(error instanceof ApiError)) throw error;
    const unplaced = error.details.filter((detail) => !place(form, detail));
    if (unplaced.length || !error.details.length) general.append(notice(error.message, true));
  } finally {
    button.disabled = false;
  }
}

/** Show a 422 detail next to the field its loc names (or the nearest enclosing one). */
function place(form, detail) {
  const loc = detail.loc[0] === "body" ? detail.loc.slice(1) : detail.loc;
  for (let n = loc.length; n > 0; n -= 1) {
    const wrapper = form.querySelector(`[data-loc="${loc.slice(0, n).join(".")}"]`);
    if (wrapper && !wrapper.classList.contains("hidden")) {
      const slot = wrapper.querySelector(":scope > .field-error") ?? wrapper.appendChild(h("span.field-error"));
      slot.textContent = [slot.textContent, detail.msg].filter(Boolean).join("; ");
      return true;
    }
  }
  return false;
}

// New job: a form built from the zoo's options and the dataset list, with the zoo's nets as
// suggestions; POST /jobs, with each 422 detail shown next to the field its `loc` names.

import { ApiError, api } from "./api.js";
import { h, notice } from "./ui.js";

// How a filled-in option field becomes the value models.build takes, by the option's kind.
const OPTION_VALUE = { choice: (value) => value, number: Number, boolean: () => true };

export async function render(view, ctx) {
  const [{ families, options }, datasets] = await Promise.all([
    api("/models/options", { signal: ctx.signal }),
    api("/datasets", { signal: ctx.signal }),
  ]);
  const general = h("div");
  const form = h("form", { id: "new-job", novalidate: true });

  const family = select("family", families);
  const modelName = text("model", { list: "zoo-names", required: true });
  const names = h("datalist", { id: "zoo-names" });
  const optionFields = Object.fromEntries(
    options.map((option) => [option.name, optionField(option)]),
  );
  const variantOption = options.find((option) => option.name === "shortcut_variant");
  const showOptions = () => {
    const variant = variantOption?.families.includes(family.value)
      ? form.elements["option.shortcut_variant"].value || variantOption.default
      : null;
    for (const option of options) {
      optionFields[option.name].classList.toggle("hidden", !applies(option, family.value, variant));
    }
  };
  let zoo = [];
  const showNames = () => {
    const inFamily = zoo.filter((m) => m.family === family.value);
    const hint = (m) => `${m.depth} layers · ${(m.params / 1e6).toFixed(2)}M params`;
    names.replaceChildren(...inFamily.map((m) => h("option", { value: m.name }, hint(m))));
    if (!zoo.some((m) => m.name === modelName.value && m.family === family.value)) {
      modelName.placeholder = inFamily[0]?.name ?? "";
    }
  };

  const dataset = select(
    "dataset",
    datasets.map((d) => d.name),
    Object.fromEntries(
      datasets.map((d) => [d.name, d.available ? d.name : `${d.name} (not here)`]),
    ),
  );
  const datasetPath = field(
    "dataset.path",
    "path (under the data root)",
    text("dataset.path", { placeholder: "uploads/…" }),
  );
  const showDataset = () => datasetPath.classList.toggle("hidden", dataset.value !== "imagefolder");
  dataset.addEventListener("change", showDataset);
  const firstAvailable = datasets.find((d) => d.available);
  if (firstAvailable) dataset.value = firstAvailable.name;

  const budgetUnit = select("budget", ["epochs", "iterations"]);
  const budget = field(
    "recipe.epochs",
    "budget",
    h(
      "span.row",
      {},
      text("budget_value", {
        type: "number",
        min: 0,
        step: "any",
        placeholder: "64000 iterations (paper)",
      }),
      budgetUnit,
    ),
  );
  budgetUnit.addEventListener("change", () => {
    budget.dataset.loc = `recipe.${budgetUnit.value}`;
  });
  const number = (name, placeholder) =>
    field(
      `recipe.${name}`,
      name,
      text(`recipe.${name}`, { type: "number", step: "any", placeholder }),
    );

  form.append(
    h(
      "fieldset",
      {},
      h("legend", {}, "Run"),
      h(
        "div.row",
        {},
        field("name", "name", text("name", { placeholder: "resnet56 baseline" })),
        field("tags", "tags (comma-separated)", text("tags", { placeholder: "paper, fig6" })),
      ),
    ),
    h(
      "fieldset",
      { dataset: { loc: "model" } },
      h("legend", {}, "Model"),
      h(
        "div.row",
        {},
        field("family", "family", family),
        field("model.name", "model", modelName, "any depth, e.g. resnet8"),
        names,
        Object.values(optionFields),
      ),
    ),
    h(
      "fieldset",
      { dataset: { loc: "dataset" } },
      h("legend", {}, "Dataset"),
      h(
        "div.row",
        {},
        field("dataset.name", "dataset", dataset),
        datasetPath,
        field(
          "dataset.validation",
          "validation fraction",
          text("dataset.validation", { type: "number", step: "any", placeholder: "0.1" }),
        ),
        field(
          "dataset.train_limit",
          "train limit",
          text("dataset.train_limit", { type: "number", placeholder: "all" }),
        ),
      ),
    ),
    h(
      "fieldset",
      { dataset: { loc: "recipe" } },
      h("legend", {}, "Recipe (empty: the paper's)"),
      h(
        "div.row",
        {},
        budget,
        number("batch_size", "128"),
        number("lr", "0.1"),
        number("momentum", "0.9"),
        number("weight_decay", "0.0001"),
        field(
          "recipe.optimizer",
          "optimizer",
          select("recipe.optimizer", ["", "sgd", "nesterov", "adamw"]),
        ),
        field(
          "recipe.schedule",
          "schedule",
          select("recipe.schedule", ["", "multistep", "cosine", "onecycle", "constant"]),
        ),
        field(
          "recipe.warmup",
          "warm-up",
          select("recipe.warmup", ["", "auto", "off", "paper", "linear"]),
        ),
        field("recipe.augment", "augment", select("recipe.augment", ["", "true", "false"])),
        number("log_every", "50"),
        number("seed", "0"),
      ),
    ),
    general,
    h("button", { type: "submit", id: "submit-job" }, "Submit job"),
  );
  // The family and the shortcut variant decide which options apply and which nets to suggest.
  form.querySelector("fieldset[data-loc=model]").addEventListener("change", () => {
    showOptions();
    showNames();
  });
  const kinds = Object.fromEntries(options.map((option) => [option.name, option.kind]));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit(form, spec(form, kinds), general, ctx);
  });
  view.append(h("h1", {}, "New job"), form);
  showOptions();
  showDataset();
  // Counting the zoo's MACs takes a while after a start: the form does not wait for them.
  api("/models", { signal: ctx.signal })
    .then((nets) => {
      zoo = nets;
      showNames();
    })
    .catch((error) => {
      if (!ctx.signal.aborted) console.error(error);
    });
}

/** A labelled form field whose 422 errors show in its own slot (`loc`: the spec path). */
function field(loc, label, input, hint) {
  const note = hint ? h("span.muted", {}, hint) : null;
  return h("label", { dataset: { loc } }, label, input, note, h("span.field-error"));
}

function text(name, attrs = {}) {
  return h("input", { name, autocomplete: "off", ...attrs });
}

/** A select of `values`, each shown as its label; "" shows as "default" unless labelled. */
function select(name, values, labels = {}) {
  const shown = (v) => labels[v] ?? (v === "" ? "default" : v);
  return h(
    "select",
    { name },
    values.map((v) => h("option", { value: v }, shown(v))),
  );
}

/** The field of one option of models.build, as the API describes it; empty: the net's default. */
function optionField(option) {
  const name = `option.${option.name}`;
  const loc = `model.options.${option.name}`;
  let wrapper;
  if (option.kind === "boolean") {
    wrapper = h(
      "label.check",
      { dataset: { loc } },
      h("input", { type: "checkbox", name }),
      option.name,
    );
  } else if (option.kind === "choice") {
    const labels = Object.fromEntries(option.choices.map((choice) => [choice.value, choice.label]));
    if (option.default !== null) labels[""] = `default: ${option.default}`;
    wrapper = field(
      loc,
      option.name,
      select(name, ["", ...option.choices.map((choice) => choice.value)], labels),
    );
  } else {
    const placeholder = option.default === null ? "" : String(option.default);
    wrapper = field(loc, option.name, text(name, { type: "number", step: "any", placeholder }));
  }
  wrapper.title = option.description;
  return wrapper;
}

/** Whether an option applies to nets of `family` with shortcut variant `variant`. */
function applies(option, family, variant) {
  if (!option.families.includes(family)) return false;
  return option.shortcut_variants === null || option.shortcut_variants.includes(variant);
}

function spec(form, kinds) {
  const values = Object.fromEntries(new FormData(form).entries());
  const num = (v) => (v === undefined || v === "" ? undefined : Number(v));
  const options = {};
  for (const [key, value] of Object.entries(values)) {
    if (!key.startsWith("option.") || value === "") continue;
    const wrapper = form.querySelector(`[name="${key}"]`).closest("label");
    if (wrapper.classList.contains("hidden")) continue;
    const name = key.slice("option.".length);
    options[name] = OPTION_VALUE[kinds[name]](value);
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
  if (values["dataset.train_limit"] !== "")
    dataset.train_limit = num(values["dataset.train_limit"]);
  const job = {
    kind: "train",
    model: { name: values.model.trim() || form.elements.model.placeholder, options },
    dataset,
    recipe,
  };
  if (values.name.trim()) job.name = values.name.trim();
  const tags = values.tags
    .split(",")
    .map((t) => t.trim())
    .filter(Boolean);
  if (tags.length) job.tags = tags;
  return job;
}

async function submit(form, job, general, ctx) {
  for (const error of form.querySelectorAll(".field-error")) error.textContent = "";
  general.replaceChildren();
  const button = form.querySelector("#submit-job");
  button.disabled = true;
  try {
    const created = await api("/jobs", { method: "POST", body: job });
    ctx.navigate(`#/runs?new=${created.id}`);
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
      const slot =
        wrapper.querySelector(":scope > .field-error") ??
        wrapper.appendChild(h("span.field-error"));
      slot.textContent = [slot.textContent, detail.msg].filter(Boolean).join("; ");
      return true;
    }
  }
  return false;
}

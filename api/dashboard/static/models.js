// Models: the registry (GET /registry), each model with its versions and aliases,
// a link to predict with each, and (for keys that may train) an import of weights.

import { API, ApiError, api, save } from "./api.js";
import { servedSection } from "./served.js";
import { h, notice, number, percent, shortId, when } from "./ui.js";

const PAGE_SIZE = 20;

export async function render(view, ctx) {
  view.append(h("h1", {}, "Models"));
  const cards = h("div", { id: "model-cards" });
  const more = h("div.row");
  let query = "";
  // A later page's failure is shown where its button was; the first page's, by the app.
  const shown = (loading) =>
    loading.catch((error) => {
      if (!ctx.signal.aborted) more.replaceChildren(notice(error.message, true));
    });
  const filter = h("input", {
    name: "q",
    type: "search",
    placeholder: "part of a name",
    onchange: (e) => {
      query = e.target.value.trim();
      cards.replaceChildren();
      shown(load(null));
    },
  });
  // A page of models after `cursor` (null: the first), appended to those shown.
  const load = async (cursor) => {
    const params = new URLSearchParams({ limit: PAGE_SIZE });
    if (query) params.set("q", query);
    if (cursor) params.set("cursor", cursor);
    const page = await api(`/registry?${params}`, { signal: ctx.signal });
    if (!cursor && !page.items.length) {
      cards.append(
        notice(
          query
            ? `No registered model's name contains “${query}”.`
            : "No registered models yet: open a succeeded run and press Register.",
        ),
      );
    }
    for (const model of page.items) cards.append(modelCard(model, ctx));
    more.replaceChildren(
      page.next_cursor
        ? h(
            "button.secondary",
            {
              id: "more-models",
              onclick: () => shown(load(page.next_cursor)),
            },
            "more models",
          )
        : "",
    );
  };
  try {
    await load(null);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      view.append(
        notice(`This server has no model registry (GET ${API}/registry answers 404).`, true),
      );
      return;
    }
    throw error;
  }
  view.append(h("div.card.row", {}, h("label", {}, "name", filter)));
  if (ctx.can("train")) view.append(importForm());
  view.append(cards, more);
}

const ARCHITECTURES = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet20"];

/** Weights made elsewhere (torchvision .pth, akamaster .th, safetensors) as a new version. */
function importForm() {
  const status = h("span.muted", { dataset: { role: "import-status" } });
  const form = h(
    "form.card.row",
    {
      id: "import-form",
      onsubmit: async (e) => {
        e.preventDefault();
        const sent = new FormData(form);
        const name = String(sent.get("name")).trim();
        sent.delete("name");
        status.textContent = "importing…";
        try {
          const made = await api(`/registry/${encodeURIComponent(name)}/versions/import`, {
            method: "POST",
            form: sent,
          });
          status.textContent = `${name}/${made.version} imported`;
          window.dispatchEvent(new HashChangeEvent("hashchange")); // draw the page again
        } catch (error) {
          status.textContent = error.message;
        }
      },
    },
    h("strong", {}, "Import weights"),
    h("label", {}, "file", h("input", { type: "file", name: "file", required: true })),
    h("label", {}, "model name", h("input", { name: "name", required: true })),
    h(
      "label",
      {},
      "architecture",
      h("input", {
        name: "architecture",
        list: "architectures",
        value: "resnet18",
        required: true,
      }),
      h(
        "datalist",
        { id: "architectures" },
        ARCHITECTURES.map((a) => h("option", { value: a })),
      ),
    ),
    h("button", { type: "submit" }, "import"),
    status,
  );
  return form;
}

/** What an imported version came from and how it was checked, in a cell. */
function importedCell(facts) {
  if (!facts) return "–";
  const checked = facts.checked_against
    ? ` · = ${facts.checked_against} (max |Δ| ${facts.max_abs_diff.toExponential(1)})`
    : "";
  return h(
    "span",
    { title: `sha256 ${facts.source_sha256}`, dataset: { role: "imported" } },
    `${facts.file_name} (${facts.format}, ${facts.keys} keys)${checked}`,
  );
}

function modelCard(model, ctx) {
  const aliases = model.aliases.map((a) => [a.alias, a.version]);
  const byVersion = new Map();
  for (const [alias, version] of aliases)
    byVersion.set(version, [...(byVersion.get(version) ?? []), alias]);
  const rows = model.versions.map((v) => {
    const job = v.job_id;
    return h(
      "tr",
      { dataset: { version: v.version } },
      h("td.num", {}, v.version),
      h(
        "td",
        {},
        (byVersion.get(v.version) ?? []).map((a) => h("span.status.succeeded", {}, a)),
        "",
      ),
      h("td", {}, job ? h("a", { href: `#/runs/${job}` }, shortId(job)) : "–"),
      h("td", {}, v.model ?? "–"),
      h("td", {}, v.checkpoint),
      h("td.num", {}, number(v.step)),
      h("td", {}, v.dataset ?? "–"),
      h("td.num", {}, percent(v.test_error)),
      h("td.num", {}, number(v.params)),
      h("td", {}, importedCell(v.imported)),
      h("td", { title: v.sha256 }, v.sha256.slice(0, 12)),
      h("td", {}, when(v.created_at)),
      h(
        "td",
        {},
        h(
          "a",
          { href: `#/predict?model=${encodeURIComponent(`${model.name}/${v.version}`)}` },
          "predict",
        ),
        " ",
        downloads(model.name, v.version, ctx),
        ctx.can("train")
          ? [
              " ",
              h(
                "button.secondary",
                {
                  dataset: { action: "alias" },
                  onclick: () => setAlias(model.name, v.version),
                },
                "set alias…",
              ),
            ]
          : null,
      ),
    );
  });
  return h(
    "div.card",
    { dataset: { model: model.name } },
    h(
      "h2",
      {},
      model.name,
      " ",
      h("span.muted", {}, aliases.map(([alias, version]) => `${alias} → v${version}`).join(" · ")),
    ),
    h(
      "table",
      {},
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          [
            "version",
            "aliases",
            "run",
            "net",
            "checkpoint",
            "step",
            "dataset",
            "test error",
            "params",
            "imported from",
            "sha256",
            "registered",
            "",
          ].map((t) => h("th", {}, t)),
        ),
      ),
      h("tbody", {}, rows),
    ),
    servedSection(model), // what each version served: payloads, drift
  );
}

async function setAlias(name, version) {
  const alias = window.prompt(`Point which alias of ${name} at version ${version}?`, "production");
  if (!alias) return;
  try {
    await api(`/registry/${encodeURIComponent(name)}/aliases/${encodeURIComponent(alias)}`, {
      method: "PUT",
      body: { version },
    });
  } catch (error) {
    window.alert(error.message);
    return;
  }
  window.dispatchEvent(new HashChangeEvent("hashchange")); // draw the page again
}

const FORMATS = ["onnx", "torchscript", "torch_export"];

/** A version's checkpoint to download, and (for keys that may train) its exports: made
 * on first asking (checked against the eager net, then kept), then downloaded. */
function downloads(name, version, ctx) {
  const path = `/registry/${encodeURIComponent(name)}/versions/${version}`;
  const status = h("span.muted", { dataset: { role: "export-status" } });
  const checkpoint = h(
    "button.secondary",
    {
      dataset: { action: "checkpoint" },
      onclick: () =>
        save(`${path}/checkpoint`, `${name}-v${version}.pt`).catch((e) => {
          status.textContent = e.message;
        }),
    },
    "checkpoint",
  );
  if (!ctx.can("train")) return checkpoint;
  const format = h(
    "select",
    { name: "format", title: "an export of the batch-norm-folded net, with its softmax" },
    FORMATS.map((f) => h("option", { value: f }, f)),
  );
  const exportButton = h(
    "button.secondary",
    {
      dataset: { action: "export" },
      onclick: async () => {
        status.textContent = "exporting…";
        try {
          const made = await api(`${path}/exports`, {
            method: "POST",
            body: { format: format.value },
          });
          status.textContent = `max |Δp| ${made.max_abs_diff.toExponential(1)}`;
          const ending = { onnx: "onnx", torchscript: "torchscript.pt", torch_export: "pt2" };
          await save(
            `${path}/exports/${made.format}/file`,
            `${name}-v${version}.${ending[made.format]}`,
          );
        } catch (e) {
          status.textContent = e.message;
        }
      },
    },
    "export",
  );
  return [checkpoint, " ", format, " ", exportButton, " ", status];
}

// Models: the registry (GET /registry), each model with its versions and aliases,
// a link to predict with each, and (for keys that may train) an import of weights.
// Each model's rollout: its aliases' weights, stickiness and shadow (with promotion for
// keys that may train), the shadows' figures against the versions they copy, its history.

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
  for (const [version, label] of aliasLabels(model.aliases))
    byVersion.set(version, [...(byVersion.get(version) ?? []), label]);
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
    rolloutSection(model, ctx), // each alias's weights and shadow, their figures, history
    servedSection(model), // what each version served: payloads, drift
  );
}

/** [version, label] of every version an alias serves or shadows: "production 90%",
 * "production (shadow 20%)", or the alias alone when it serves one version. */
function aliasLabels(aliases) {
  const labels = [];
  for (const a of aliases) {
    const weights = Object.entries(a.weights ?? { [a.version]: 100 });
    const total = weights.reduce((sum, [, w]) => sum + w, 0);
    for (const [version, weight] of weights) {
      const share = weights.length > 1 ? ` ${Math.round((100 * weight) / total)}%` : "";
      labels.push([Number(version), `${a.alias}${share}`]);
    }
    if (a.shadow) labels.push([a.shadow.version, `${a.alias} (shadow ${a.shadow.percent}%)`]);
  }
  return labels;
}

/** A model's rollout: per alias its split, stickiness and shadow (promote buttons for
 * keys that may train), the shadows' comparisons, and the registry's history on demand. */
function rolloutSection(model, ctx) {
  const path = `/registry/${encodeURIComponent(model.name)}`;
  const rows = model.aliases.map((a) => {
    const weights = Object.entries(a.weights ?? { [a.version]: 100 });
    const total = weights.reduce((sum, [, w]) => sum + w, 0);
    const split = weights
      .map(([v, w]) => `v${v} ${weights.length > 1 ? `${w} (${percent(w / total)})` : ""}`)
      .join(" · ");
    const candidates = [
      ...weights.map(([v]) => Number(v)),
      ...(a.shadow ? [a.shadow.version] : []),
    ];
    const promote =
      ctx.can("train") && candidates.length > 1
        ? candidates.map((v) =>
            h(
              "button.secondary",
              {
                dataset: { action: "promote", version: v },
                onclick: () => promoteAlias(model.name, a.alias, v),
              },
              `promote v${v}`,
            ),
          )
        : "";
    return h(
      "tr",
      { dataset: { alias: a.alias } },
      h("td", {}, a.alias),
      h("td", { dataset: { role: "weights" } }, split.trim()),
      h("td", { dataset: { role: "sticky" } }, a.sticky ? "sticky" : "–"),
      h(
        "td",
        { dataset: { role: "shadow" } },
        a.shadow ? `v${a.shadow.version} (${a.shadow.percent}% copied)` : "–",
      ),
      h("td", {}, when(a.updated_at)),
      h("td", {}, promote),
    );
  });
  const comparisons = h("div", { dataset: { role: "shadow-figures" } });
  if (model.aliases.some((a) => a.shadow)) {
    api(`${path}/shadow`, { signal: ctx.signal })
      .then((figures) => comparisons.replaceChildren(shadowTable(figures)))
      .catch((error) => comparisons.replaceChildren(notice(error.message, true)));
  }
  const history = h("div", { dataset: { role: "history" } });
  const details = h(
    "details",
    {
      dataset: { role: "history-panel" },
      ontoggle: () => {
        if (!details.open || history.childElementCount) return;
        api(`${path}/history?limit=50`, { signal: ctx.signal })
          .then((entries) => history.replaceChildren(historyTable(entries)))
          .catch((error) => history.replaceChildren(notice(error.message, true)));
      },
    },
    h("summary", {}, "history"),
    history,
  );
  const head = ["alias", "weights", "sticky", "shadow", "updated", ""].map((t) => h("th", {}, t));
  return h(
    "div",
    { dataset: { role: "rollout" } },
    model.aliases.length
      ? h(
          "table",
          { dataset: { role: "aliases" } },
          h("thead", {}, h("tr", {}, head)),
          h("tbody", {}, rows),
        )
      : "",
    comparisons,
    details,
  );
}

/** The shadows' figures against the versions they copy (this API process's count). */
function shadowTable(figures) {
  if (!figures.length) return notice("No copies compared by the shadow yet.");
  const fixed = (x, digits) => (x === null ? "–" : x.toFixed(digits));
  const head = [
    "version",
    "shadow",
    "images",
    "top-1 agreement",
    "mean |Δp|",
    "latency ms",
    "dropped",
  ];
  return h(
    "table",
    { dataset: { role: "shadow" } },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        head.map((t) => h("th", {}, t)),
      ),
    ),
    h(
      "tbody",
      {},
      figures.map((f) =>
        h(
          "tr",
          { dataset: { version: f.version, shadow: f.shadow } },
          h("td.num", {}, `v${f.version}`),
          h("td.num", {}, `v${f.shadow}`),
          h("td.num", {}, number(f.images)),
          h("td.num", {}, f.agreement === null ? "–" : percent(f.agreement)),
          h("td.num", {}, fixed(f.mean_abs_diff, 4)),
          h("td.num", {}, fixed(f.mean_latency_ms, 1)),
          h("td.num", {}, number(f.dropped + f.failed)),
        ),
      ),
    ),
  );
}

/** A registry state of the history in a few characters: weights, sticky, shadow. */
function brief(state) {
  if (!state) return "–";
  if (!state.weights) return Object.values(state).join(" ");
  const weights = Object.entries(state.weights).map(([v, w]) => `v${v}=${w}`);
  const shadow = state.shadow ? [`shadow v${state.shadow.version}:${state.shadow.percent}%`] : [];
  return [...weights, ...(state.sticky ? ["sticky"] : []), ...shadow].join(" ");
}

function historyTable(entries) {
  if (!entries.length) return notice("No changes recorded.");
  return h(
    "table",
    { dataset: { role: "history" } },
    h(
      "thead",
      {},
      h(
        "tr",
        {},
        ["when", "who", "what", "before", "after"].map((t) => h("th", {}, t)),
      ),
    ),
    h(
      "tbody",
      {},
      entries.map((e) =>
        h(
          "tr",
          { dataset: { action: e.action } },
          h("td", {}, when(e.at)),
          h("td", { title: e.key_id ?? "" }, e.key_name ?? (e.key_id ? shortId(e.key_id) : "–")),
          h(
            "td",
            {},
            [e.action, e.alias, e.version === null ? null : `v${e.version}`]
              .filter(Boolean)
              .join(" "),
          ),
          h("td", {}, brief(e.before)),
          h("td", {}, brief(e.after)),
        ),
      ),
    ),
  );
}

async function promoteAlias(name, alias, version) {
  if (!window.confirm(`Serve ${name}/${version} alone through ${alias}?`)) return;
  try {
    await api(
      `/registry/${encodeURIComponent(name)}/aliases/${encodeURIComponent(alias)}/promote`,
      { method: "POST", body: { version } },
    );
  } catch (error) {
    window.alert(error.message);
    return;
  }
  window.dispatchEvent(new HashChangeEvent("hashchange")); // draw the page again
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

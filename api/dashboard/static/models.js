// Models: the registry (GET /api/v1/registry), each model with its versions and aliases,
// and a link to predict with each.

import { ApiError, api } from "./api.js";
import { h, notice, number, percent, shortId, when } from "./ui.js";

export async function render(view, ctx) {
  view.append(h("h1", {}, "Models"));
  let found;
  try {
    found = await api("/api/v1/registry", { signal: ctx.signal });
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      view.append(notice("This server has no model registry (GET /api/v1/registry answers 404).", true));
      return;
    }
    throw error;
  }
  const registered = found;
  if (!registered.length) {
    view.append(notice("No registered models yet: open a succeeded run and press Register."));
    return;
  }
  for (const model of registered) view.append(modelCard(model, ctx));
}

function modelCard(model, ctx) {
  const aliases = model.aliases.map((a) => [a.alias, a.version]);
  const byVersion = new Map();
  for (const [alias, version] of aliases) byVersion.set(version, [...(byVersion.get(version) ?? []), alias]);
  const rows = model.versions.map((v) => {
    const job = v.job_id;
    return h("tr", { dataset: { version: v.version } },
      h("td.num", {}, v.version),
      h("td", {}, (byVersion.get(v.version) ?? []).map((a) => h("span.status.succeeded", {}, a)), ""),
      h("td", {}, job ? h("a", { href: `#/runs/${job}` }, shortId(job)) : "–"),
      h("td", {}, v.model ?? "–"), h("td", {}, v.checkpoint), h("td.num", {}, number(v.step)),
      h("td", {}, v.dataset ?? "–"), h("td.num", {}, percent(v.test_error)),
      h("td.num", {}, number(v.params)), h("td", { title: v.sha256 }, v.sha256.slice(0, 12)),
      h("td", {}, when(v.created_at)),
      h("td", {}, h("a", { href: `#/predict?model=${encodeURIComponent(`${model.name}/${v.version}`)}` }, "predict"),
        ctx.can("train") ? [" ", h("button.secondary", {
          dataset: { action: "alias" }, onclick: () => setAlias(model.name, v.version, ctx),
        }, "set alias…")] : null));
  });
  return h("div.card", { dataset: { model: model.name } },
    h("h2", {}, model.name, " ", h("span.muted", {},
      aliases.map(([alias, version]) => `${alias} → v${version}`).join(" · "))),
    h("table", {}, h("thead", {}, h("tr", {}, ["version", "aliases", "run", "net", "checkpoint", "step", "dataset",
      "test error", "params", "sha256", "registered", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows)));
}

async function setAlias(name, version, ctx) {
  const alias = window.prompt(`Point which alias of ${name} at version ${version}?`, "production");
  if (!alias) return;
  try {
    await api(`/api/v1/registry/${encodeURIComponent(name)}/aliases/${encodeURIComponent(alias)}`, {
      method: "PUT", body: { version },
    });
  } catch (error) {
    window.alert(error.message);
    return;
  }
  window.dispatchEvent(new HashChangeEvent("hashchange")); // draw the page again
}

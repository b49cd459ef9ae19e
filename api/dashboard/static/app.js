// The dashboard's shell: the caller's session (scopes), hash routes, and page lifetimes.

import { api } from "./api.js";
import * as compare from "./compare.js";
import * as detail from "./detail.js";
import * as models from "./models.js";
import * as newJob from "./newjob.js";
import * as predict from "./predict.js";
import * as runs from "./runs.js";
import * as studies from "./studies.js";
import * as study from "./study.js";
import { h, notice } from "./ui.js";
import * as workers from "./workers.js";

const ROUTES = [
  [/^#\/runs\/([0-9a-f-]{36})$/, detail, "runs"],
  [/^#\/compare$/, compare, "compare"],
  [/^#\/new$/, newJob, "new"],
  [/^#\/studies\/new$/, studies.newStudy, "studies"],
  [/^#\/studies\/([0-9a-f-]{36})$/, study, "studies"],
  [/^#\/studies$/, studies, "studies"],
  [/^#\/models$/, models, "models"],
  [/^#\/predict$/, predict, "predict"],
  [/^#\/workers$/, workers, "workers"],
  [/^(#\/runs)?$/, runs, "runs"],
];

const context = {
  session: { auth_enabled: false, scopes: [] },
  /** Whether the caller may do what `scope` allows (admin allows everything). */
  can(scope) {
    const scopes = this.session.scopes;
    return scopes.includes(scope) || scopes.includes("admin");
  },
  navigate(hash) {
    location.hash = hash;
  },
};

let leave = null; // the current page's cleanup: stop polls and streams

async function render() {
  const [path, search] = location.hash.split("?");
  const params = new URLSearchParams(search ?? "");
  let page = null;
  let name = null;
  let id = null;
  for (const [pattern, module, route] of ROUTES) {
    const match = path.match(pattern);
    if (match) {
      [page, name, id] = [module, route, match[1]];
      break;
    }
  }
  leave?.();
  leave = null;
  for (const link of document.querySelectorAll("header nav a")) {
    link.classList.toggle("active", link.dataset.page === name);
  }
  const view = document.getElementById("view");
  view.replaceChildren();
  for (const key of Object.keys(view.dataset)) delete view.dataset[key];
  if (!page) {
    view.append(notice(`No page at ${location.hash}`, true));
    return;
  }
  const controller = new AbortController();
  leave = () => controller.abort();
  document.body.dataset.page = name;
  try {
    await page.render(view, { params, id, signal: controller.signal, ...context });
  } catch (error) {
    if (controller.signal.aborted) return;
    view.append(notice(error.message, true));
    console.error(error);
  }
}

async function start() {
  context.session = await api("/whoami");
  const auth = context.session.auth_enabled;
  document.getElementById("who").textContent = auth
    ? `key: ${context.session.scopes.join(", ")}`
    : "auth off";
  for (const link of document.querySelectorAll("header nav a[data-scope]")) {
    link.classList.toggle("hidden", !context.can(link.dataset.scope));
  }
  window.addEventListener("hashchange", render);
  await render();
  document.body.dataset.ready = "1";
}

start().catch((error) => {
  document.getElementById("view").replaceChildren(h("p.error", {}, error.message));
});

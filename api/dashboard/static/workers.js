// Workers: every registered worker with its devices, queues, current job and jobs done,
// alive or lost (no heartbeat for three leases); refreshed while the page is open.

import { api } from "./api.js";
import { h, number, shortId, statusBadge, when } from "./ui.js";

const POLL_MS = 3000;

export async function render(view, ctx) {
  const table = h("table", { id: "workers" });
  view.append(h("h1", {}, "Workers"), h("div.card", {}, table));
  let timer = null;
  const load = async () => {
    clearTimeout(timer);
    try {
      draw(table, await api("/workers", { signal: ctx.signal }));
    } catch (error) {
      if (ctx.signal.aborted) return;
      table.replaceChildren(h("caption.error", {}, error.message));
    }
    if (!ctx.signal.aborted) timer = setTimeout(load, POLL_MS);
  };
  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  await load();
}

function draw(table, workers) {
  const labels = ["worker", "state", "devices", "queues", "job", "jobs done", "started", "seen"];
  const head = h(
    "tr",
    {},
    labels.map((label) => h("th", {}, label)),
  );
  const rows = workers.map((worker) =>
    h(
      "tr",
      { dataset: { name: worker.name, state: worker.state } },
      h("td", { title: `pid ${worker.pid} on ${worker.host}` }, worker.name),
      h("td", {}, statusBadge(worker.state)),
      h("td.devices", {}, worker.devices.join(", ")),
      h(
        "td.queues",
        {},
        worker.queues.map((queue) => h("span.tag", {}, queue)),
      ),
      h(
        "td.job",
        {},
        worker.current_job
          ? h("a", { href: `#/runs/${worker.current_job}` }, shortId(worker.current_job))
          : "–",
      ),
      h("td.num.done", {}, number(worker.jobs_done)),
      h("td", {}, when(worker.started_at)),
      h("td", {}, when(worker.last_seen_at)),
    ),
  );
  const empty = h("tr", {}, h("td.muted", { colSpan: labels.length }, "No workers registered."));
  table.replaceChildren(h("thead", {}, head), h("tbody", {}, rows.length ? rows : [empty]));
}

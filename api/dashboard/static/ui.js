// Small DOM and formatting helpers shared by the pages.

/** An element: h("td.num", {title: "x"}, child, "text", ...). */
export function h(tag, attrs = {}, ...children) {
  const [name, ...classes] = tag.split(".");
  const element = document.createElement(name);
  if (classes.length) element.className = classes.join(" ");
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) element.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(element.dataset, value);
    else if (key in element && key !== "list") element[key] = value;
    else element.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : String(child));
  }
  return element;
}

export const percent = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(2)}%`);
export const number = (x) => (x === null || x === undefined ? "–" : x.toLocaleString("en-US"));
export const rate = (x) =>
  x === null || x === undefined ? "–" : Math.round(x).toLocaleString("en-US");
export const when = (t) => (t ? new Date(t).toLocaleString() : "–");
export const shortId = (id) => String(id).slice(0, 8);

export function duration(job) {
  if (job.results?.wall_time_s) return seconds(job.results.wall_time_s);
  if (!job.started_at) return "–";
  const end = job.finished_at ? new Date(job.finished_at) : new Date();
  return seconds((end - new Date(job.started_at)) / 1000);
}

export function seconds(s) {
  if (s < 60) return `${s.toFixed(1)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`;
}

export const statusBadge = (status) => h(`span.status.${status}`, { dataset: { status } }, status);

// The service's words, sent in the page from the one declaration the API and its Python
// client share (client.wire): a job's statuses, and those of a job not yet over.
const WORDS = JSON.parse(document.getElementById("words").textContent);
export const STATUSES = WORDS.statuses;
export const ACTIVE = new Set(WORDS.active);

export function notice(text, bad = false) {
  return h(bad ? "div.notice.bad" : "div.notice", { role: bad ? "alert" : "status" }, text);
}

/**
 * A button that runs `action` once at a time; a message it returns, or its error, goes to
 * `messages`.
 */
export function actionButton(messages, label, action, cls = "button.secondary") {
  return h(
    cls,
    {
      dataset: { action: label.toLowerCase() },
      onclick: async (event) => {
        event.target.disabled = true;
        try {
          const message = await action();
          if (message) messages.replaceChildren(notice(message));
        } catch (error) {
          messages.replaceChildren(notice(error.message, true));
        } finally {
          event.target.disabled = false;
        }
      },
    },
    label,
  );
}

export function jobTitle(job) {
  const what = `${job.kind === "evaluate" ? "evaluate " : ""}${job.model ?? job.kind}`;
  return job.name || `${what} on ${job.dataset ?? "?"} · ${shortId(job.id)}`;
}

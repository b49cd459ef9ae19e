// The API client: JSON requests with the session's key, the key prompt on 401, and event
// streams read with fetch (EventSource cannot send an Authorization header).

/** Where the API lives; every path the dashboard asks for is relative to it. */
export const API = "/api/v1";
const KEY = "resnet-service.key";
let pendingKey = null;

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message ?? `HTTP ${status}`);
    this.status = status;
    this.details = body?.error?.details ?? [];
  }
}

/** The Authorization header of the session's key, if it has one. */
export function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** Ask for an API key in the dialog (one prompt however many requests wait for it). */
export function askForKey(reason) {
  if (pendingKey) return pendingKey;
  const dialog = document.getElementById("auth");
  const input = document.getElementById("auth-key");
  document.getElementById("auth-reason").textContent = reason;
  input.value = "";
  pendingKey = new Promise((resolve) => {
    dialog.addEventListener(
      "close",
      () => {
        sessionStorage.setItem(KEY, input.value.trim());
        pendingKey = null;
        resolve();
      },
      { once: true },
    );
  });
  dialog.showModal();
  return pendingKey;
}

/** A request to `API + path`; JSON in and out, FormData as is, errors as ApiError. */
export async function api(path, { method = "GET", body, form, signal } = {}) {
  const headers = authHeaders();
  let payload = form;
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(`${API}${path}`, { method, headers, body: payload, signal });
  if (response.status === 401) {
    const problem = await response.json().catch(() => null);
    await askForKey(problem?.error?.message ?? "This service asks for an API key.");
    return api(path, { method, body, form, signal });
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

/** Fetch `path` with the session's key and save it as `filename` (a plain link cannot
 * send the key, so the file is saved from a blob). */
export async function save(path, filename) {
  const response = await fetch(`${API}${path}`, { headers: authHeaders() });
  if (response.status === 401) {
    await askForKey("This service asks for an API key.");
    return save(path, filename);
  }
  if (!response.ok) throw new ApiError(response.status, await response.json().catch(() => null));
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

/** A query string from an object, leaving out empty values; arrays repeat the key. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    for (const item of Array.isArray(value) ? value : [value]) {
      if (item !== undefined && item !== null && item !== "") search.append(name, item);
    }
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/**
 * Follow a job's Server-Sent Events until `end` (or until `signal` aborts); reconnects after
 * a dropped connection or a stream that reached its maximum life, resuming after the last
 * log line and metric step seen.
 */
export async function follow(jobId, sinceStep, handlers, signal) {
  let lastEventId = 0;
  let step = sinceStep;
  while (!signal.aborted) {
    try {
      const headers = { ...authHeaders(), Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = String(lastEventId);
      const path = `${API}/jobs/${jobId}/events${query({ since_step: step })}`;
      const response = await fetch(path, { headers, signal });
      if (!response.ok)
        throw new ApiError(response.status, await response.json().catch(() => null));
      for await (const event of readEvents(response.body)) {
        if (event.id) lastEventId = Number(event.id);
        const data = JSON.parse(event.data);
        if (event.event === "metrics") step = Math.max(step, ...maxSteps(data.series)) + 1;
        await handlers[event.event]?.(data);
        if (event.event === "end") return;
      }
    } catch (error) {
      if (signal.aborted) return;
      // Too many streams open (429) is worth waiting out, as a server error is.
      if (error instanceof ApiError && error.status < 500 && error.status !== 429) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

function maxSteps(series) {
  return Object.values(series).map((s) => s.steps[s.steps.length - 1] ?? 0);
}

async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n?/g, "\n");
    for (let end = buffer.indexOf("\n\n"); end >= 0; end = buffer.indexOf("\n\n")) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = { event: "message", data: "", id: null };
      const data = [];
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "data") data.push(text);
        else if (field === "event" || field === "id") event[field] = text;
      }
      if (data.length) {
        event.data = data.join("\n");
        yield event;
      }
    }
  }
}

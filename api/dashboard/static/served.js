// What was served, per registered version (GET .../payloads and .../drift): the payload
// log's segments with their downloads, and the drift of the served images and answers
// from the training data. Drawn on opening, so the models page costs no request per version.

import { api, save } from "./api.js";
import { h, notice, number, when } from "./ui.js";

const SEGMENTS_SHOWN = 10;
const fixed = (x, digits = 3) => (x === null || x === undefined ? "–" : x.toFixed(digits));

/** A model card's section: one closed panel per version, drawn when opened. */
export function servedSection(model) {
  return h(
    "div.served",
    { dataset: { role: "served" } },
    model.versions.map((v) => versionPanel(model.name, v.version)),
  );
}

function versionPanel(name, version) {
  const path = `/registry/${encodeURIComponent(name)}/versions/${version}`;
  const body = h("div", {}, h("p.muted", {}, "Loading…"));
  let drawn = false;
  return h(
    "details",
    {
      dataset: { servedVersion: version },
      ontoggle: (e) => {
        if (!e.target.open || drawn) return;
        drawn = true;
        draw(body, path, `${name}-v${version}`).catch((error) => {
          body.replaceChildren(notice(error.message, true));
        });
      },
    },
    h("summary", {}, `v${version}: what was served`),
    body,
  );
}

async function draw(body, path, stem) {
  const [drift, segments] = await Promise.all([
    // 409: drift is turned off on this server (DRIFT_ENABLED); the payloads still show.
    api(`${path}/drift`).catch((e) => (e.status === 409 ? { off: e.message } : Promise.reject(e))),
    api(`${path}/payloads?limit=${SEGMENTS_SHOWN}`),
  ]);
  body.replaceChildren(driftTable(drift), segmentTable(segments, path, stem));
}

/** The window's per-channel shift and class distance against the training data. */
function driftTable(drift) {
  if (drift.off) return notice(drift.off);
  const w = drift.window;
  const heading = h(
    "p",
    { dataset: { role: "drift-window" } },
    `Drift over ${number(w.images)} images served by this API process `,
    h("span.muted", {}, `(the last ${number(w.max_images)} within ${number(w.max_seconds)} s)`),
  );
  if (!drift.reference || !w.images) {
    return h("div", {}, heading, notice("Nothing served since this API process started."));
  }
  const rows = drift.channels.map((c) =>
    h(
      "tr",
      { dataset: { channel: c.channel } },
      h("td.num", {}, c.channel),
      h("td.num", {}, fixed(c.mean)),
      h("td.num", {}, fixed(drift.reference.mean[c.channel])),
      h("td.num", {}, fixed(c.std)),
      h("td.num", {}, fixed(drift.reference.std[c.channel])),
      h("td.num", { dataset: { role: "shift" } }, fixed(c.shift, 2)),
    ),
  );
  const classes = drift.classes;
  return h(
    "div",
    {},
    heading,
    h(
      "table",
      { dataset: { role: "drift" } },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ["channel", "mean served", "mean train", "std served", "std train", "shift"].map((t) =>
            h("th", {}, t),
          ),
        ),
      ),
      h("tbody", {}, rows),
    ),
    classes
      ? h(
          "p",
          { dataset: { role: "class-drift" } },
          `Predicted classes against ${
            drift.reference.class_source === "training_split"
              ? "the training split's class shares"
              : "a uniform reference"
          }: total variation ${fixed(classes.total_variation)}`,
          ` · Jensen-Shannon ${fixed(classes.jensen_shannon)}`,
          ` · χ² p ${classes.p_value === null ? "–" : classes.p_value.toExponential(1)}`,
        )
      : "",
  );
}

/** The newest segments of the payload log, each downloadable. */
function segmentTable(page, path, stem) {
  if (!page.items.length) {
    return notice("No payloads logged (PAYLOAD_LOG_SAMPLE is 0, or nothing was served yet).");
  }
  const status = h("span.muted");
  const rows = page.items.map((s) =>
    h(
      "tr",
      { dataset: { segment: s.name } },
      h("td", {}, when(s.first_at)),
      h("td", {}, when(s.last_at)),
      h("td.num", {}, number(s.records)),
      h("td.num", {}, number(s.bytes)),
      h(
        "td",
        {},
        h(
          "button.secondary",
          {
            dataset: { action: "payloads" },
            onclick: () =>
              save(`${path}/payloads/${s.name}`, `${stem}-${s.name}`).catch((e) => {
                status.textContent = e.message;
              }),
          },
          "download",
        ),
      ),
    ),
  );
  return h(
    "div",
    {},
    h(
      "table",
      { dataset: { role: "payloads" } },
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          ["first", "last", "records", "bytes", ""].map((t) => h("th", {}, t)),
        ),
      ),
      h("tbody", {}, rows),
    ),
    page.next_cursor ? h("p.muted", {}, `the ${SEGMENTS_SHOWN} newest segments`) : "",
    status,
  );
}

// A run's note and tags, editable by its owner (or an admin): PATCH /jobs/{id}.

import { api } from "./api.js";
import { h, notice } from "./ui.js";

/** The note card of `job`: a textarea, the tags comma-separated, and Save. */
export function noteCard(job, canEdit) {
  const messages = h("div");
  const note = h("textarea", {
    name: "note",
    value: job.note ?? "",
    placeholder: "What this run is for, what it showed…",
    disabled: !canEdit,
    maxLength: 10000,
  });
  const tags = h("input", {
    name: "tags",
    value: job.tags.join(", "),
    placeholder: "fig6, keep",
    disabled: !canEdit,
  });
  const save = h(
    "button",
    {
      id: "save-note",
      disabled: !canEdit,
      onclick: async () => {
        save.disabled = true;
        try {
          const edited = await api(`/jobs/${job.id}`, {
            method: "PATCH",
            body: { note: note.value, tags: splitTags(tags.value) },
          });
          job.note = edited.note;
          job.tags = edited.tags;
          messages.replaceChildren(notice("Saved."));
        } catch (error) {
          messages.replaceChildren(notice(error.message, true));
        } finally {
          save.disabled = false;
        }
      },
    },
    "Save",
  );
  return h(
    "div.card",
    { id: "note" },
    messages,
    h("label", {}, "note", note),
    h("div.row", {}, h("label.wide", {}, "tags (comma-separated)", tags), save),
  );
}

function splitTags(text) {
  return text
    .split(",")
    .map((t) => t.trim())
    .filter(Boolean);
}

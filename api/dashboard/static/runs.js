// Runs: the job table with filters (and `path op value` expressions), sort, cursor pages,
// selection for compare, CSV export, live status.

import { api, query, save } from "./api.js";
import {
  ACTIVE,
  duration,
  h,
  jobTitle,
  notice,
  number,
  percent,
  rate,
  STATUSES,
  statusBadge,
  when,
} from "./ui.js";

const PAGE_SIZE = 50;
const POLL_MS = 2000;
const SELECTED = "resnet-service.compare";
const SORTS = {
  "-created": "newest first",
  created: "oldest first",
  "-finished": "finished, newest",
  finished: "finished, oldest",
  best_test_error: "best test error, lowest",
  "-best_test_error": "best test error, highest",
  final_test_error: "final test error, lowest",
  params: "params, fewest",
  "-params": "params, most",
  wall_time_s: "wall time, shortest",
  "-images_per_s": "images/s, most",
};

// Kept across visits of the page, so that going back to Runs shows the same view.
const state = {
  filters: { status: "", kind: "", family: "", dataset: "", tag: "", q: "", filter: "" },
  sort: "-created",
  sortKey: "", // a sort the menu does not offer, e.g. -summary.best_train_error
  cursors: [null], // the cursor of each page visited so far; the last is the current page
};

export function selected() {
  return JSON.parse(sessionStorage.getItem(SELECTED) ?? "[]");
}

function setSelected(ids) {
  sessionStorage.setItem(SELECTED, JSON.stringify(ids));
}

export async function render(view, ctx) {
  // The filters' choices come from the API: a new job kind or net family needs no change here.
  const [datasets, kinds, zoo] = await Promise.all([
    api("/datasets", { signal: ctx.signal }),
    api("/jobs/kinds", { signal: ctx.signal }),
    api("/models/options", { signal: ctx.signal }),
  ]);
  const table = h("table", { id: "runs" });
  const pager = h("div.pager");
  const compareButton = h("button", { id: "compare-selected", onclick: () => goCompare(ctx) });
  const fresh = ctx.params.get("new");
  const asked = ctx.params.get("filter");
  if (asked !== null) {
    // A link to the runs of one thing (a run page's data digest) sets the expressions.
    state.filters.filter = asked;
    state.cursors = [null];
  }
  if (fresh) view.append(notice(`Job ${fresh} submitted; it is listed below and updates live.`));
  view.append(
    h("h1", {}, "Runs"),
    filterForm(
      {
        datasets: datasets.map((d) => d.name),
        kinds: kinds.map((k) => k.kind),
        families: zoo.families,
      },
      () => restart(),
    ),
    h("div.row", {}, compareButton, csvButton()),
    h("div.card", {}, table, pager),
  );
  let timer = null;
  const restart = () => {
    state.cursors = [null];
    load();
  };
  const load = async () => {
    clearTimeout(timer);
    const cursor = state.cursors[state.cursors.length - 1];
    const params = { ...searchParams(), limit: PAGE_SIZE, cursor };
    let page;
    try {
      page = await api(`/jobs${query(params)}`, { signal: ctx.signal });
    } catch (error) {
      if (ctx.signal.aborted) return;
      table.replaceChildren(h("caption.error", {}, error.message));
      return;
    }
    drawTable(table, page.items, fresh, () => drawCompare(compareButton), load);
    drawPager(pager, page.next_cursor, load);
    drawCompare(compareButton);
    if (page.items.some((job) => ACTIVE.has(job.status)) && !ctx.signal.aborted) {
      timer = setTimeout(load, POLL_MS);
    }
  };
  ctx.signal.addEventListener("abort", () => clearTimeout(timer));
  await load();
}

/** The list's filters and sort as query parameters (expressions split at commas). */
function searchParams() {
  const filter = state.filters.filter
    .split(",")
    .map((e) => e.trim())
    .filter(Boolean);
  return { ...state.filters, filter, sort: state.sortKey || state.sort };
}

function csvButton() {
  return h(
    "button.secondary",
    {
      id: "export-csv",
      title: "every run that passes the filters, as CSV",
      onclick: () => save(`/jobs.csv${query(searchParams())}`, "runs.csv").catch(() => {}),
    },
    "Export CSV",
  );
}

function filterForm(choices, changed) {
  const filters = state.filters;
  const choice = (name, label, values, labels = {}) =>
    h(
      "label",
      {},
      label,
      h(
        "select",
        {
          name,
          onchange: (e) => {
            filters[name] = e.target.value;
            changed();
          },
        },
        h("option", { value: "" }, "any"),
        values.map((v) => h("option", { value: v, selected: filters[name] === v }, labels[v] ?? v)),
      ),
    );
  // A search box that keeps its trimmed value in `into[key]`.
  const search = (tag, name, label, placeholder, into, key) =>
    h(
      tag,
      {},
      label,
      h("input", {
        name,
        value: into[key],
        placeholder,
        type: "search",
        onchange: (e) => {
          into[key] = e.target.value.trim();
          changed();
        },
      }),
    );
  const text = (name, label, placeholder) =>
    search("label", name, label, placeholder, filters, name);
  const sort = h(
    "label",
    {},
    "sort",
    h(
      "select",
      {
        name: "sort",
        onchange: (e) => {
          state.sort = e.target.value;
          changed();
        },
      },
      Object.entries(SORTS).map(([v, l]) =>
        h("option", { value: v, selected: state.sort === v }, l),
      ),
    ),
  );
  return h(
    "form.card.row",
    { id: "filters", onsubmit: (e) => e.preventDefault() },
    choice("status", "status", STATUSES),
    choice("kind", "kind", choices.kinds),
    choice("family", "model family", choices.families),
    choice("dataset", "dataset", choices.datasets),
    text("tag", "tag", "paper-fig6"),
    text("q", "name contains", "resnet56…"),
    sort,
    search("label", "sort-key", "or sort by", "-summary.best_train_error", state, "sortKey"),
    search(
      "label.wide",
      "filter",
      "where (path op value, comma-separated)",
      "best_test_error<0.08, model.options.unit=full_preact, recipe.lr>=0.1",
      filters,
      "filter",
    ),
  );
}

const COLUMNS = [
  ["", null],
  ["run", null],
  ["status", null],
  ["kind", null],
  ["model", null],
  ["dataset", null],
  ["depth", null, true],
  ["params", null, true],
  ["best test err", "best_test_error", true],
  ["final test err", null, true],
  ["duration", null, true],
  ["images/s", null, true],
  ["created", "created"],
];

function drawTable(table, jobs, fresh, selectionChanged, reload) {
  const header = h(
    "tr",
    {},
    COLUMNS.map(([label, sort, num]) => {
      if (!sort) return h(num ? "th.num" : "th", {}, label);
      const arrow = state.sort === sort ? " ▲" : state.sort === `-${sort}` ? " ▼" : "";
      return h(
        num ? "th.num.sortable" : "th.sortable",
        {
          dataset: { sort },
          onclick: () => {
            state.sort = state.sort === `-${sort}` ? sort : `-${sort}`;
            state.cursors = [null];
            document.querySelector('#filters select[name="sort"]').value = state.sort;
            reload();
          },
        },
        label + arrow,
      );
    }),
  );
  const chosen = new Set(selected());
  const rows = jobs.map((job) =>
    h(
      job.id === fresh ? "tr.fresh" : "tr",
      { dataset: { id: job.id } },
      h(
        "td",
        {},
        h("input", {
          type: "checkbox",
          checked: chosen.has(job.id),
          title: "select to compare",
          onchange: (e) => {
            const ids = selected().filter((id) => id !== job.id);
            if (e.target.checked) ids.push(job.id);
            setSelected(ids);
            selectionChanged();
          },
        }),
      ),
      h(
        "td",
        {},
        h("a", { href: `#/runs/${job.id}` }, jobTitle(job)),
        job.tags.map((t) => h("span.tag", {}, t)),
      ),
      h("td", {}, statusBadge(job.status), job.status === "running" ? progressText(job) : null),
      h("td", {}, job.kind),
      h("td", {}, job.model ?? "–"),
      h("td", {}, job.dataset ?? "–"),
      h("td.num", {}, job.depth ?? "–"),
      h("td.num", {}, number(job.results.params)),
      h("td.num", { dataset: { col: "best" } }, percent(job.results.best_test_error)),
      h("td.num", {}, percent(job.results.final_test_error)),
      h("td.num", {}, duration(job)),
      h("td.num", {}, rate(job.results.images_per_s)),
      h("td", {}, when(job.created_at)),
    ),
  );
  const body = rows.length
    ? rows
    : [h("tr", {}, h("td.muted", { colSpan: COLUMNS.length }, "No runs match."))];
  table.replaceChildren(h("thead", {}, header), h("tbody", {}, body));
}

function progressText(job) {
  const { step, total_steps: total } = job.progress;
  return total ? h("span.muted", {}, ` ${Math.round((100 * step) / total)}%`) : null;
}

function drawPager(pager, nextCursor, load) {
  const page = state.cursors.length;
  pager.replaceChildren(
    h(
      "button.secondary",
      {
        id: "prev-page",
        disabled: page === 1,
        onclick: () => {
          state.cursors.pop();
          load();
        },
      },
      "‹ prev",
    ),
    h("span.muted", {}, `page ${page} · ${PAGE_SIZE} per page`),
    h(
      "button.secondary",
      {
        id: "next-page",
        disabled: !nextCursor,
        onclick: () => {
          state.cursors.push(nextCursor);
          load();
        },
      },
      "next ›",
    ),
  );
}

function drawCompare(button) {
  const count = selected().length;
  button.textContent = `Compare selected (${count})`;
  button.disabled = count < 2;
}

function goCompare(ctx) {
  ctx.navigate(`#/compare?ids=${selected().join(",")}`);
}

// The filters of a bucket's pages (queue.js, buckets.js), kept in the URL's fragment
// (#/queue/<bucket>?class_name=vehicle&camera_id=cam-b&...): a form that shows them and,
// when applied, moves to the URL with the new ones (so reload, back and links keep them),
// and their translations to the API's query (GetReviewQueue, ListBucketItems: the same
// filters, the queue's order aside) and to a
// SightingFilter body (BulkDecideSightings). Times are UTC, typed as datetime-local.
import { api } from "./api.js";
import { h } from "./dom.js";
import { go } from "./nav.js";

/** Review states a page may ask for, by the URL's `state`: the queue's default (empty)
 * is pending; a listing's is every state. */
const STATES = {
  pending: ["pending"],
  accepted: ["accepted"],
  rejected: ["rejected"],
  decided: ["accepted", "rejected"],
  any: ["pending", "accepted", "rejected"],
};

export const QUEUE_FIELDS = ["order", "state", "class_name", "camera_id", "run_id", "from", "to", "min_score", "max_score"];
export const ITEM_FIELDS = ["state", "class_name", "camera_id", "run_id", "from", "to", "min_score", "max_score"];

/** A datetime-local value ("2024-05-01T08:00") as an RFC 3339 UTC instant. */
export function utcInstant(value) {
  if (!value) return "";
  const full = value.length === 16 ? `${value}:00` : value;
  return full.endsWith("Z") ? full : `${full}Z`;
}

/** The review states the URL's `state` names (none: the API's default). */
export function statesOf(params, fallback) {
  return STATES[params.get("state") || fallback] || [];
}

/** The API's query for the filters in `params`, as a query string (review_state repeats). */
export function apiQuery(params, fields, { fallbackState = "" } = {}) {
  const query = new URLSearchParams();
  for (const state of statesOf(params, fallbackState)) query.append("review_state", state);
  for (const name of ["order", "class_name", "camera_id", "run_id", "min_score", "max_score"]) {
    if (fields.includes(name) && params.get(name)) query.set(name, params.get(name));
  }
  for (const name of ["from", "to"]) {
    if (fields.includes(name) && params.get(name)) query.set(name, utcInstant(params.get(name)));
  }
  return query;
}

/** BulkDecideSightings' `filter`: the queue's filters in `params`, the queue's default
 * state (pending) included. */
export function sightingFilter(params) {
  const filter = { review_states: statesOf(params, "pending") };
  for (const name of ["class_name", "camera_id", "run_id"]) {
    if (params.get(name)) filter[name] = params.get(name);
  }
  if (params.get("from")) filter.frame_time_from = utcInstant(params.get("from"));
  if (params.get("to")) filter.frame_time_to = utcInstant(params.get("to"));
  if (params.get("min_score")) filter.min_score = Number(params.get("min_score"));
  if (params.get("max_score")) filter.max_score = Number(params.get("max_score"));
  return filter;
}

/** The filters in words ("pending, class vehicle, camera cam-b"), for headings and the
 * bulk action's confirmation. */
export function describeFilter(params, fields, fallbackState) {
  const parts = [params.get("state") || fallbackState || "any state"];
  const said = {
    class_name: "class", camera_id: "camera", run_id: "run", from: "from", to: "before",
    min_score: "score at least", max_score: "score at most",
  };
  for (const [name, word] of Object.entries(said)) {
    if (!fields.includes(name) || !params.get(name)) continue;
    const value = name === "from" || name === "to" ? `${params.get(name).replace("T", " ")} UTC` : params.get(name);
    parts.push(`${word} ${value}`);
  }
  return parts.join(", ");
}

function field(id, label, control) {
  return h("div", { class: "field" }, h("label", { for: id, text: label }), control);
}

function select(id, value, options) {
  return h("select", { id, name: id }, options.map(([v, text]) => h("option", { value: v, text, selected: v === value })));
}

function input(id, value, attributes = {}) {
  return h("input", { id, name: id, value: value || "", ...attributes });
}

/** The filter form of `fields`, showing `params`; Apply goes to `base` with the new ones
 * (and none of the page's other parameters, so paging starts over). */
export function filterForm({ base, params, fields, fallbackState, keep = [] }) {
  const controls = [];
  if (fields.includes("order")) {
    controls.push(field("f-order", "Order", select("f-order", params.get("order") || "oldest", [
      ["oldest", "Oldest first"], ["lowest_score", "Lowest score first"], ["camera", "By camera"],
    ])));
  }
  if (fields.includes("state")) {
    const states = [["pending", "Pending"], ["accepted", "Accepted"], ["rejected", "Rejected"], ["decided", "Decided"], ["any", "Any state"]];
    const options = fallbackState === "pending" ? states : [["", "Any state"], ...states.filter(([v]) => v !== "any")];
    controls.push(field("f-state", "State", select("f-state", params.get("state") || fallbackState || "", options)));
  }
  if (fields.includes("class_name")) controls.push(field("f-class_name", "Class", input("f-class_name", params.get("class_name"), { size: 10 })));
  if (fields.includes("camera_id")) controls.push(field("f-camera_id", "Camera", input("f-camera_id", params.get("camera_id"), { size: 10 })));
  if (fields.includes("run_id")) controls.push(field("f-run_id", "Run", input("f-run_id", params.get("run_id"), { size: 10 })));
  if (fields.includes("from")) controls.push(field("f-from", "From (UTC)", input("f-from", params.get("from"), { type: "datetime-local", step: 1 })));
  if (fields.includes("to")) controls.push(field("f-to", "Before (UTC)", input("f-to", params.get("to"), { type: "datetime-local", step: 1 })));
  if (fields.includes("min_score")) controls.push(field("f-min_score", "Score at least", input("f-min_score", params.get("min_score"), { type: "number", min: 0, max: 1, step: "any", inputmode: "decimal" })));
  if (fields.includes("max_score")) controls.push(field("f-max_score", "Score at most", input("f-max_score", params.get("max_score"), { type: "number", min: 0, max: 1, step: "any", inputmode: "decimal" })));
  const form = h(
    "form", { class: "filter bucket-filter", "aria-label": "Filters" },
    controls,
    h("div", { class: "filter-buttons" },
      h("button", { type: "submit", text: "Apply filters" }),
      h("button", { type: "button", class: "secondary", text: "Clear", onclick: () => go(base) })),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = new URLSearchParams();
    for (const name of keep) if (params.get(name)) next.set(name, params.get(name));
    for (const name of fields) {
      const control = form.elements.namedItem(`f-${name}`);
      const value = control ? control.value.trim() : "";
      if (value && !(name === "order" && value === "oldest") && !(name === "state" && value === fallbackState)) next.set(name, value);
    }
    const query = next.toString();
    go(query ? `${base}?${query}` : base);
  });
  return form;
}

/** The buckets (GetSummary's, deleted ones left out), for the pickers. */
export async function listBuckets() {
  const summary = await api("GET", "/api/workshop/summary", { query: { days: 1 } });
  return summary.buckets;
}

/** The classes a run's models know (its snapshot's pinned models), asked once per run. */
const runClasses = new Map();
export function classesOfRun(runId) {
  if (!runClasses.has(runId)) {
    const asked = api("GET", `/api/workshop/runs/${encodeURIComponent(runId)}/snapshot`, { query: { page_size: 1 } })
      .then((answer) => {
        const classes = [];
        for (const model of answer.snapshot.models || []) {
          for (const name of model.classes || []) if (!classes.includes(name)) classes.push(name);
        }
        return classes;
      })
      .catch((error) => {
        runClasses.delete(runId);
        throw error;
      });
    runClasses.set(runId, asked);
  }
  return runClasses.get(runId);
}

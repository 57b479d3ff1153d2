// The review page (#/review/<run_id>): a full run's saved items grouped by sighting
// (GET /api/workshop/runs/{run_id}/review), one row of thumbnails per sighting, decided
// from the keyboard (j/k, c, n, 1-9, u, e; decisions.js, as on the review queue) through
// POST .../sightings/{id}/decision. A decision shows as made only once the server
// answered that it stored it.
import { api, currentSession } from "./api.js";
import { SightingDecisions } from "./decisions.js";
import { h, placed, show } from "./dom.js";
import { byline, ItemEditor } from "./item_editor.js";
import { accountBar } from "./runs.js";

const THUMB_WIDTH = 160;
const THUMB_HEIGHT = 90;
// A long sighting shows this many of its frames, spread over its span, until asked for
// all: a row of 500 thumbnails is no help to decide, and costs the page its speed.
const SAMPLE = 12;

const path = (runId) => `/api/workshop/runs/${encodeURIComponent(runId)}`;

/** The classes a sighting can be relabelled to: every pinned model's, in model order. */
export function relabelClasses(models) {
  const classes = [];
  for (const model of models) {
    for (const name of model.classes) if (!classes.includes(name)) classes.push(name);
  }
  return classes;
}

/** "pending", "accepted", "accepted as vehicle", "rejected", "pending (2 new items)". */
export function stateText(sighting) {
  if (sighting.review_state === "accepted" && sighting.relabel_class) {
    return `accepted as ${sighting.relabel_class}`;
  }
  if (sighting.review_state === "pending" && sighting.decided_at && sighting.pending_items > 0) {
    const n = sighting.pending_items;
    return `pending (${n} new item${n === 1 ? "" : "s"})`;
  }
  return sighting.review_state;
}

/** Indexes of `count` frames to show: all up to `limit`, else `limit` of them evenly
 * spread, the first and the last included. */
export function sampled(count, limit = SAMPLE) {
  if (count <= limit) return [...Array(count).keys()];
  return [...Array(limit).keys()].map((i) => Math.round((i * (count - 1)) / (limit - 1)));
}

/** An item's state from its boxes' (docs/review.md): pending while any box is, else
 * accepted when any box is, else rejected. */
function itemState(item) {
  const states = item.box_reviews.map((review) => review.review_state);
  if (states.length === 0 || states.includes("pending")) return "pending";
  return states.includes("accepted") ? "accepted" : "rejected";
}

const utcTime = (timestamp) => new Date(timestamp).toISOString().slice(11, 19);

function timeSpan(sighting) {
  const first = utcTime(sighting.first_frame_time);
  const last = utcTime(sighting.last_frame_time);
  return first === last ? `${first} UTC` : `${first}–${last} UTC`;
}

const describe = (sighting) =>
  `${sighting.class_name || "no detection"} on ${sighting.camera_id} at ${timeSpan(sighting)}`;

export async function reviewView({ main, account, id: runId, params, alive }) {
  const pageSize = params.get("page_size") || undefined;
  const session = await currentSession();
  const [detail, first] = await Promise.all([
    api("GET", path(runId)),
    api("GET", `${path(runId)}/review`, { query: { page_size: pageSize } }),
  ]);
  if (!alive()) return;
  accountBar(account, session);

  const run = detail.detail.run;
  const classes = relabelClasses(first.models);
  const items = new Map(); // item id -> BucketItem, of the pages loaded
  const sightings = new Map(); // sighting id -> Sighting, in page order
  const rows = new Map(); // sighting id -> its <li>
  let nextToken = "";
  let hasMore = false;
  const order = []; // sighting ids as shown

  const heading = h("h1", { tabindex: "-1", text: `Review of run ${runId}` });
  const progress = h("p", { id: "review-progress", class: "progress" });
  const list = h("ol", { id: "sightings", class: "sightings", "aria-label": "Sightings" });
  const more = h("button", {
    type: "button", id: "load-more", class: "secondary", hidden: true, onclick: () => loadMore(),
    text: "Load more items",
  });
  const decisions = new SightingDecisions({
    idPrefix: "review", order, rows, classes, alive,
    sighting: (id) => sightings.get(id),
    describe,
    decisionPath: (id) => `${path(runId)}/sightings/${encodeURIComponent(id)}/decision`,
    decided: (id, answer) => {
      applyDecided(id, answer.sighting);
      return describe(answer.sighting);
    },
    joinedSince: "since this page loaded",
    render: renderRow,
    settled: updateProgress,
    hasMore: () => hasMore,
    loadMore,
    edit: editFirstFrame,
    editHelp: "correct the boxes of the current sighting's first frame, or decide that frame alone (or Enter on a frame)",
  });

  function updateProgress() {
    const all = [...sightings.values()];
    const decided = all.filter((s) => s.review_state !== "pending").length;
    const loaded = [...items.values()];
    const itemsDecided = loaded.filter((item) => item.review_state !== "pending").length;
    const saved = run.counts.items_saved;
    const scope = hasMore ? ` (of the ${loaded.length} loaded; ${saved} saved in all)` : "";
    progress.textContent = `Decided: ${decided} of ${all.length} sightings, ` +
      `${itemsDecided} of ${loaded.length} items${scope}.`;
  }

  const expanded = new Set(); // sightings showing every frame

  function thumbnails(shownId, sighting) {
    const all = expanded.has(shownId);
    const ids = [shownId, sighting.sighting_id];
    const shown = all ? sighting.item_ids : sampled(sighting.item_ids.length).map((i) => sighting.item_ids[i]);
    return shown.map((itemId) => {
      const item = items.get(itemId);
      const when = item ? `${utcTime(item.frame_time)} UTC` : "a frame not loaded yet";
      const marks = item ? [item.correction ? "corrected" : null, item.item_decision ? "decided alone" : null].filter(Boolean) : [];
      const figure = h(
        "figure", { class: "thumb", "data-item-id": itemId },
        h(
          "button", {
            type: "button", class: "thumb-edit", disabled: !item,
            "aria-label": `Edit the boxes of the frame of ${sighting.camera_id} at ${when}${marks.length ? ` (${marks.join(", ")})` : ""}`,
            onclick: (event) => {
              event.stopPropagation();
              openEditor(itemId, event.currentTarget);
            },
          },
          h("img", {
            src: `${path(runId)}/items/${encodeURIComponent(itemId)}/image`,
            loading: "lazy", decoding: "async", width: THUMB_WIDTH, height: THUMB_HEIGHT,
            alt: `${sighting.camera_id}, ${when}`,
          }),
        ),
        marks.length ? h("span", { class: "item-mark", "aria-hidden": "true", text: marks.join(" · ") }) : null,
      );
      const review = item && item.box_reviews.find((r) => ids.includes(r.sighting_id));
      const box = review && review.box_index >= 0 ? item.boxes[review.box_index] : null;
      if (box) figure.append(placed(h("span", { class: "thumb-box", "aria-hidden": "true" }), box));
      return figure;
    });
  }

  const editor = new ItemEditor();

  /** The item editor on `itemId`; what it saves updates the item and its sightings' rows. */
  function openEditor(itemId, opener) {
    const item = items.get(itemId);
    if (!item) return;
    const rowId = opener.closest("li.sighting").dataset.sightingId;
    editor.open({
      item, runId, classes,
      opener: () => rows.get(rowId).querySelector(`[data-item-id="${CSS.escape(itemId)}"] .thumb-edit`),
      onChange: (changed) => {
        items.set(changed.item_id, changed);
        for (const [id, sighting] of sightings) {
          if (sighting.item_ids.includes(changed.item_id)) renderRow(id);
        }
        updateProgress();
      },
    });
  }

  function renderRow(sightingId) {
    const sighting = sightings.get(sightingId);
    const saving = decisions.saving(sightingId);
    const count = sighting.item_ids.length;
    const content = [
      h(
        "div", { class: "sighting-head" },
        h("span", { class: "sighting-class", text: sighting.class_name || "no detection" }),
        h("span", {
          class: "muted",
          text: `${sighting.camera_id} · ${timeSpan(sighting)} · ${count} item${count === 1 ? "" : "s"}`,
        }),
        h("span", {
          class: `state state-${sighting.review_state}`, "data-state": sighting.review_state,
          text: stateText(sighting),
        }),
        sighting.decided_by
          ? h("span", { class: "muted decided-by", text: `by ${byline(sighting.decided_by, sighting.decided_at)}` })
          : null,
        saving ? h("span", { class: "saving", text: "saving…" }) : null,
      ),
      h("div", { class: "thumbs" }, thumbnails(sightingId, sighting)),
      count > SAMPLE
        ? h("button", {
          type: "button", class: "secondary more-frames",
          "aria-expanded": String(expanded.has(sightingId)),
          onclick: () => {
            if (expanded.has(sightingId)) expanded.delete(sightingId);
            else expanded.add(sightingId);
            renderRow(sightingId);
          },
          text: expanded.has(sightingId) ? `Show ${SAMPLE} frames` : `Show all ${count} frames`,
        })
        : null,
    ];
    let row = rows.get(sightingId);
    if (!row) {
      row = h("li", {
        class: "sighting", tabindex: "-1", "data-sighting-id": sightingId,
        onclick: () => decisions.select(order.indexOf(sightingId)),
      });
      rows.set(sightingId, row);
    }
    row.setAttribute("aria-label", `${describe(sighting)}: ${stateText(sighting)}`);
    row.setAttribute("aria-busy", String(saving));
    row.classList.toggle("is-saving", saving);
    show(row, content);
    return row;
  }

  function addPage(page) {
    for (const entry of page.items) items.set(entry.item.item_id, entry.item);
    const touched = [];
    for (const sighting of page.sightings) {
      const known = sightings.has(sighting.sighting_id);
      sightings.set(sighting.sighting_id, sighting);
      if (known) {
        touched.push(sighting.sighting_id);
      } else {
        order.push(sighting.sighting_id);
        list.append(renderRow(sighting.sighting_id));
      }
    }
    for (const sightingId of touched) renderRow(sightingId); // now with this page's boxes
    if (decisions.current >= 0) rows.get(decisions.currentId()).classList.add("current");
    hasMore = page.has_more;
    nextToken = page.next_page_token;
    more.hidden = !hasMore;
    updateProgress();
  }

  let loading = null;
  function loadMore() {
    if (!hasMore) return Promise.resolve();
    if (loading) return loading;
    more.disabled = true;
    loading = api("GET", `${path(runId)}/review`, { query: { page_size: pageSize, page_token: nextToken } })
      .then((page) => {
        if (alive()) addPage(page);
      })
      .catch((error) => decisions.failed(error))
      .finally(() => {
        more.disabled = false;
        loading = null;
      });
    return loading;
  }

  /** Applies the decision to the sighting's items as the server did (every box of it).
   * The row keeps the id it was shown with: a late commit can give the sighting an
   * earlier first item, and so a new id (docs/review.md), which the answer carries. */
  function applyDecided(shownId, sighting) {
    sightings.set(shownId, sighting);
    const ids = [shownId, sighting.sighting_id];
    for (const itemId of sighting.item_ids) {
      const item = items.get(itemId);
      if (!item) continue;
      for (const review of item.box_reviews) {
        if (!ids.includes(review.sighting_id)) continue;
        review.review_state = sighting.review_state;
        if (sighting.relabel_class) review.relabel_class = sighting.relabel_class;
        else delete review.relabel_class;
      }
      item.review_state = itemState(item);
    }
  }

  /** "e": the item editor on the sighting's first frame shown. */
  function editFirstFrame(sightingId) {
    const first = rows.get(sightingId).querySelector(".thumb-edit:not([disabled])");
    if (first) openEditor(first.closest("[data-item-id]").dataset.itemId, first);
  }

  if (run.mode !== "full") {
    show(main, heading, h("p", {
      id: "review-empty",
      text: "This is a test run: it saves nothing, so there is nothing to review.",
    }));
    document.title = `Review ${runId} · Workshop`;
    heading.focus();
    return;
  }

  addPage(first);
  show(
    main,
    heading,
    h("p", { class: "muted", text: `Workflow ${run.workflow_id || "photo"}, run ${run.status}.` }),
    decisions.keys,
    // kept in view while the list scrolls: what is decided, the buttons, what happened
    h("div", { class: "review-sticky" }, progress, decisions.actions, decisions.announce, decisions.failure),
    order.length ? list : h("p", { id: "review-empty", text: "No saved items to review yet." }),
    more,
    editor.node,
  );
  document.title = `Review ${runId} · Workshop`;
  decisions.listen();
  heading.focus();
  performance.mark("review-shown"); // for bench/page_load.py's timing
}

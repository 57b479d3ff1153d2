// The review queue page (#/queue/<bucket_id>?order=...&class_name=...): a bucket's
// sightings across runs (GET /api/workshop/buckets/{id}/queue), in the order and with the
// filters of the URL (filters.js), a page at a time by the queue's keyset token as the
// user reaches the end; decided from the keyboard as on the review page (j/k, c, n, 1-9,
// u, e; decisions.js) through each sighting's run (POST .../runs/{run}/sightings/{id}/decision); a
// frame opens the item editor (item_editor.js). A bulk action decides every sighting the
// filters select: previewed (dry run), confirmed with its counts, applied with the
// preview's selection revision (a changed selection is shown and asked again, never
// applied), and undone as one (DELETE /api/workshop/bulk-decisions/{id}).
// #/queue without a bucket: the buckets to pick one from.
import { api, ApiError, currentSession } from "./api.js";
import { scoreText } from "./boxes.js";
import { SightingDecisions } from "./decisions.js";
import { h, placed, show } from "./dom.js";
import { apiQuery, classesOfRun, describeFilter, filterForm, listBuckets, QUEUE_FIELDS, sightingFilter } from "./filters.js";
import { byline, ItemEditor } from "./item_editor.js";
import { sampled, stateText } from "./review.js";
import { accountBar } from "./runs.js";

const THUMB_WIDTH = 160;
const THUMB_HEIGHT = 90;
const PAGE_SIZE = 20;

const bucketPath = (bucketId) => `/api/workshop/buckets/${encodeURIComponent(bucketId)}`;
const runPath = (runId) => `/api/workshop/runs/${encodeURIComponent(runId)}`;
const utcTime = (timestamp) => new Date(timestamp).toISOString().slice(0, 19).replace("T", " ");
const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function timeSpan(sighting) {
  const first = utcTime(sighting.first_frame_time);
  const last = utcTime(sighting.last_frame_time);
  return first === last ? `${first} UTC` : `${first}–${last.slice(11)} UTC`;
}

const describe = (sighting) =>
  `${sighting.class_name || "no detection"} on ${sighting.camera_id} at ${timeSpan(sighting)}`;

const DECISIONS = { confirm: "confirm", none: "none (not there)" };

/** The buckets to pick from, each with its pending count, a link to its queue and to
 * its browser. */
export function bucketList(buckets, id) {
  if (buckets.length === 0) return h("p", { id: `${id}-empty`, text: "No buckets yet." });
  return h(
    "ul", { id, class: "bucket-list" },
    buckets.map((bucket) => h(
      "li", { "data-bucket-id": bucket.bucket_id },
      h("span", { class: "bucket-name", text: bucket.name && bucket.name !== bucket.bucket_id ? `${bucket.name} (${bucket.bucket_id})` : bucket.bucket_id }),
      h("span", { class: "muted", text: `${bucket.images} items, ${bucket.pending} pending` }),
      h("span", { class: "bucket-links" },
        h("a", { href: `#/queue/${encodeURIComponent(bucket.bucket_id)}`, "aria-label": `Review queue of ${bucket.bucket_id}`, text: "Review queue" }),
        h("a", { href: `#/buckets/${encodeURIComponent(bucket.bucket_id)}`, "aria-label": `Browse items of ${bucket.bucket_id}`, text: "Browse items" })),
    )),
  );
}

async function pickBucket({ main, account, alive }) {
  const session = await currentSession();
  const buckets = await listBuckets();
  if (!alive()) return;
  accountBar(account, session);
  const heading = h("h1", { tabindex: "-1", text: "Review queue" });
  show(main, heading, h("p", { text: "Pick a bucket: its queue holds the sightings of every run that saved into it." }), bucketList(buckets, "queue-buckets"));
  document.title = "Review queue · Workshop";
  heading.focus();
}

export async function queueView(context) {
  if (!context.id) return pickBucket(context);
  const { main, account, id: bucketId, params, alive } = context;
  const pageSize = params.get("page_size") || PAGE_SIZE;
  const base = `#/queue/${encodeURIComponent(bucketId)}`;
  const query = apiQuery(params, QUEUE_FIELDS);
  const session = await currentSession();
  const first = await api("GET", `${bucketPath(bucketId)}/queue?${query}`, { query: { page_size: pageSize } });
  if (!alive()) return;
  accountBar(account, session);

  const entries = new Map(); // sighting id -> QueuedSighting, as shown
  const rows = new Map(); // sighting id -> its <li>
  const items = new Map(); // item id -> BucketItem, of the sightings loaded
  const order = [];
  const classes = []; // the relabel keys' classes: every loaded run's, in the order met
  let nextToken = "";

  const heading = h("h1", { tabindex: "-1", text: `Review queue of ${bucketId}` });
  const scope = h("p", { id: "queue-scope", class: "muted" });
  const list = h("ol", { id: "queue", class: "sightings", "aria-label": "Sightings" });
  const empty = h("p", { id: "queue-empty", hidden: true, text: "No sightings match: the queue is empty." });
  const more = h("button", { type: "button", id: "queue-more", class: "secondary", hidden: true, onclick: () => loadMore(), text: "Load more sightings" });
  const decisions = new SightingDecisions({
    idPrefix: "queue", order, rows, classes, alive,
    sighting: (id) => entries.get(id).sighting,
    describe,
    decisionPath: (id) => `${runPath(entries.get(id).run_id)}/sightings/${encodeURIComponent(id)}/decision`,
    decided: showDecided,
    joinedSince: "since it was shown",
    render: renderRow,
    settled: updateScope,
    hasMore: () => Boolean(nextToken),
    loadMore,
    edit: (id) => openEditor(id, entries.get(id).sighting.item_ids[0]), // its first thumbnail
    editHelp: "open the current sighting's first frame in the item editor (or Enter on a frame)",
  });
  const fail = (text) => decisions.fail(text);
  const failed = (error) => decisions.failed(error);

  function updateScope() {
    const decided = order.filter((id) => entries.get(id).sighting.review_state !== "pending").length;
    const tail = nextToken ? " (more follow)" : "";
    scope.textContent = `${describeFilter(params, QUEUE_FIELDS, "pending")}; ${order.length} sightings shown${tail}, ${decided} decided here.`;
  }

  async function addClasses(runIds) {
    const lists = await Promise.all([...new Set(runIds)].map((runId) => classesOfRun(runId).catch(() => [])));
    let added = false;
    for (const names of lists) {
      for (const name of names) {
        if (!classes.includes(name)) {
          classes.push(name);
          added = true;
        }
      }
    }
    if (!added) return;
    decisions.classesChanged();
    bulk.classesChanged();
  }

  /** The items of a sighting (for its thumbnails' boxes and the editor): the bucket's
   * items of its camera within its time span (ListBucketItems), paged until all found. */
  async function loadItems(entry) {
    const sighting = entry.sighting;
    const wanted = new Set(sighting.item_ids.filter((id) => !items.has(id)));
    if (wanted.size === 0) return;
    const to = new Date(Date.parse(sighting.last_frame_time) + 1).toISOString();
    const from = new Date(Math.floor(Date.parse(sighting.first_frame_time))).toISOString();
    let token = "";
    for (let pages = 0; pages < 20 && wanted.size > 0; pages += 1) {
      const page = await api("GET", `${bucketPath(bucketId)}/items`, {
        query: { camera_id: sighting.camera_id, from, to, page_size: 1000, page_token: token },
      });
      for (const item of page.items) {
        if (wanted.delete(item.item_id)) items.set(item.item_id, item);
      }
      token = page.next_page_token;
      if (!token) break;
    }
  }

  function thumbnails(sightingId) {
    const entry = entries.get(sightingId);
    const sighting = entry.sighting;
    const ids = sampled(sighting.item_ids.length).map((i) => sighting.item_ids[i]);
    return ids.map((itemId) => {
      const item = items.get(itemId);
      const when = item ? `${utcTime(item.frame_time)} UTC` : "a frame";
      const figure = h(
        "figure", { class: "thumb", "data-item-id": itemId },
        h("button", {
          type: "button", class: "thumb-edit",
          "aria-label": `Open the frame of ${sighting.camera_id} at ${when} in the item editor`,
          onclick: (event) => {
            event.stopPropagation();
            openEditor(sightingId, itemId);
          },
        }, h("img", {
          src: `${runPath(entry.run_id)}/items/${encodeURIComponent(itemId)}/image`,
          loading: "lazy", decoding: "async", width: THUMB_WIDTH, height: THUMB_HEIGHT,
          alt: `${sighting.camera_id}, ${when}`,
        })),
      );
      const review = item && item.box_reviews.find((r) => r.sighting_id === sighting.sighting_id);
      const box = review && review.box_index >= 0 ? item.boxes[review.box_index] : null;
      if (box) figure.append(placed(h("span", { class: "thumb-box", "aria-hidden": "true" }), box));
      return figure;
    });
  }

  function renderRow(sightingId) {
    const entry = entries.get(sightingId);
    const sighting = entry.sighting;
    const saving = decisions.saving(sightingId);
    const count = sighting.item_ids.length;
    let row = rows.get(sightingId);
    if (!row) {
      row = h("li", {
        class: "sighting", tabindex: "-1", "data-sighting-id": sightingId, "data-run-id": entry.run_id,
        onclick: () => decisions.select(order.indexOf(sightingId)),
      });
      rows.set(sightingId, row);
    }
    row.setAttribute("aria-label", `${describe(sighting)}, run ${entry.run_id}, score ${scoreText(entry.score)}: ${stateText(sighting)}`);
    row.setAttribute("aria-busy", String(saving));
    row.classList.toggle("is-saving", saving);
    row.classList.toggle("current", decisions.currentId() === sightingId);
    show(
      row,
      h(
        "div", { class: "sighting-head" },
        h("span", { class: "sighting-class", text: sighting.class_name || "no detection" }),
        h("span", { class: "score", text: `score ${scoreText(entry.score)}` }),
        h("span", { class: "muted", text: `${sighting.camera_id} · ${timeSpan(sighting)} · ${plural(count, "item")}` }),
        h("a", { href: `#/review/${encodeURIComponent(entry.run_id)}`, class: "run-link", text: `run ${entry.run_id}` }),
        h("span", { class: `state state-${sighting.review_state}`, "data-state": sighting.review_state, text: stateText(sighting) }),
        sighting.decided_by
          ? h("span", { class: "muted decided-by", text: `by ${byline(sighting.decided_by, sighting.decided_at)}` })
          : null,
        saving ? h("span", { class: "saving", text: "saving…" }) : null,
      ),
      h("div", { class: "thumbs" }, thumbnails(sightingId)),
    );
    return row;
  }

  const editor = new ItemEditor();

  async function openEditor(sightingId, itemId) {
    const entry = entries.get(sightingId);
    try {
      await loadItems(entry);
      const runClasses = await classesOfRun(entry.run_id);
      const item = items.get(itemId);
      if (!alive()) return;
      if (!item) {
        fail("That frame is no longer in the bucket.");
        return;
      }
      editor.open({
        item, runId: entry.run_id, classes: runClasses,
        opener: () => rows.get(sightingId)?.querySelector(`[data-item-id="${CSS.escape(itemId)}"] .thumb-edit`),
        onChange: (changed) => {
          items.set(changed.item_id, changed);
          renderRow(sightingId);
        },
      });
    } catch (error) {
      failed(error);
    }
  }

  function addPage(page) {
    const fresh = [];
    for (const entry of page.sightings) {
      const id = entry.sighting.sighting_id;
      if (entries.has(id)) continue;
      entries.set(id, entry);
      order.push(id);
      fresh.push(entry);
      list.append(renderRow(id));
    }
    nextToken = page.next_page_token;
    more.hidden = !nextToken;
    empty.hidden = order.length > 0;
    updateScope();
    // the boxes on the thumbnails come a moment later, a sighting at a time
    for (const entry of fresh) {
      loadItems(entry).then(() => {
        if (alive()) renderRow(entry.sighting.sighting_id);
      }).catch(() => {});
    }
    return addClasses(fresh.map((entry) => entry.run_id));
  }

  let loading = null;
  function loadMore() {
    if (!nextToken) return Promise.resolve();
    if (loading) return loading;
    more.disabled = true;
    loading = api("GET", `${bucketPath(bucketId)}/queue?${query}`, { query: { page_size: pageSize, page_token: nextToken } })
      .then((page) => (alive() ? addPage(page) : null))
      .catch((error) => failed(error))
      .finally(() => {
        more.disabled = false;
        loading = null;
      });
    return loading;
  }

  /** The list from its first page again (after a bulk action or its undo). */
  async function reload() {
    const page = await api("GET", `${bucketPath(bucketId)}/queue?${query}`, { query: { page_size: pageSize } });
    if (!alive()) return;
    entries.clear();
    rows.clear();
    order.length = 0;
    decisions.reset();
    list.replaceChildren();
    await addPage(page);
  }

  /** A stored decision: the row shows it; the items' boxes are read again (the editor
   * reads them when opened), and how the message names the sighting. */
  function showDecided(sightingId, answer) {
    const entry = entries.get(sightingId);
    entries.set(sightingId, { ...entry, sighting: answer.sighting });
    for (const itemId of answer.sighting.item_ids) items.delete(itemId);
    loadItems(entries.get(sightingId)).then(() => alive() && renderRow(sightingId)).catch(() => {});
    return `${describe(answer.sighting)} (run ${entry.run_id})`;
  }

  const bulk = bulkAction({ bucketId, params, classes, alive, reload, failed });

  await addPage(first);
  if (!alive()) return;
  show(
    main,
    heading,
    h("p", { class: "muted", text: "Sightings of every run that saved into this bucket, a page at a time." }),
    filterForm({ base, params, fields: QUEUE_FIELDS, fallbackState: "pending", keep: ["page_size"] }),
    scope,
    bulk.node,
    decisions.keys,
    h("div", { class: "review-sticky" }, decisions.actions, decisions.announce, decisions.failure),
    list,
    empty,
    more,
    editor.node,
  );
  document.title = `Review queue ${bucketId} · Workshop`;
  decisions.listen();
  heading.focus();
  performance.mark("queue-shown");
}

/** The bulk action on the queue's filters: decision, Preview (dry run), the counts and
 * Apply (with the preview's selection revision), then the action id with its Undo. */
function bulkAction({ bucketId, params, classes, alive, reload, failed }) {
  const decision = h("select", { id: "bulk-decision" });
  const result = h("div", { id: "bulk-result", role: "status" });
  const problem = h("div", { id: "bulk-error", role: "alert" });
  const preview = h("button", { type: "submit", id: "bulk-preview", text: "Decide all matching…" });
  let pending = null; // { body, answer } of the preview awaiting confirmation

  function fillDecisions() {
    const chosen = decision.value;
    show(decision,
      Object.entries(DECISIONS).map(([value, text]) => h("option", { value, text: `→ ${text}` })),
      classes.map((name) => h("option", { value: `relabel:${name}`, text: `→ relabel to ${name}` })));
    if (chosen) decision.value = chosen;
  }
  fillDecisions();

  function body() {
    const [kind, name] = decision.value.split(/:(.*)/s);
    const out = { decision: kind, filter: sightingFilter(params) };
    if (kind === "relabel") out.class_name = name;
    return out;
  }

  const decisionWords = (b) => (b.decision === "relabel" ? `relabel to ${b.class_name}` : DECISIONS[b.decision]);

  function confirmation(answer, b, changed) {
    const what = `${plural(answer.sightings_selected, "sighting")} match (${describeFilter(params, QUEUE_FIELDS, "pending")}); ` +
      `deciding them "${decisionWords(b)}" changes ${plural(answer.sightings_changed, "sighting")} and ${plural(answer.items_changed, "item")}.`;
    const apply = h("button", {
      type: "button", id: "bulk-apply", onclick: () => applyIt(),
      text: `Apply to ${plural(answer.sightings_selected, "sighting")} (${plural(answer.items_changed, "item")} change)`,
    });
    const cancel = h("button", { type: "button", class: "secondary", id: "bulk-cancel", text: "Cancel", onclick: () => {
      pending = null;
      show(result, h("p", { class: "notice", text: "Cancelled: nothing was decided." }));
      preview.focus();
    } });
    show(problem);
    show(result,
      h("p", { id: "bulk-preview-text", class: changed ? "error" : "notice", text: changed ? `The selection changed since the preview. Now: ${what} Apply again?` : `Preview: ${what}` }),
      answer.sightings_selected > 0 ? h("div", { class: "actions" }, apply, cancel) : null);
    if (answer.sightings_selected > 0) apply.focus();
  }

  async function previewIt(changed = false) {
    const b = body();
    show(problem);
    preview.disabled = true;
    try {
      const answer = await api("POST", `${bucketPath(bucketId)}/bulk-decisions`, { body: { ...b, dry_run: true } });
      if (!alive()) return;
      pending = { body: b, answer };
      confirmation(answer, b, changed);
    } catch (error) {
      pending = null;
      showError(error);
    } finally {
      preview.disabled = false;
    }
  }

  function showError(error) {
    if (error instanceof ApiError && error.status === 401) {
      failed(error);
      return;
    }
    show(problem, h("p", { class: "error", text: `Not applied: ${error.message}` }));
  }

  async function applyIt() {
    if (!pending) return;
    const { body: b, answer } = pending;
    pending = null;
    try {
      const applied = await api("POST", `${bucketPath(bucketId)}/bulk-decisions`, {
        body: { ...b, expected_selection_revision: answer.selection_revision },
      });
      if (!alive()) return;
      const action = applied.action;
      const undoButton = h("button", { type: "button", id: "bulk-undo", class: "secondary", text: "Undo this bulk action", onclick: () => undoIt(action, undoButton) });
      show(result, h("p", { id: "bulk-done", class: "notice" },
        `Applied "${decisionWords(b)}" to ${plural(applied.sightings_selected, "sighting")}: ${plural(applied.sightings_changed, "sighting")} and ${plural(applied.items_changed, "item")} changed. Action `,
        h("code", { id: "bulk-action-id", text: action.action_id }), "."), undoButton);
      undoButton.focus();
      await reload();
    } catch (error) {
      if (error instanceof ApiError && error.reason === "STALE_REVISION") {
        await previewIt(true); // never applied silently: the new counts, asked again
        return;
      }
      showError(error);
    }
  }

  async function undoIt(action, button) {
    button.disabled = true;
    try {
      const answer = await api("DELETE", `/api/workshop/bulk-decisions/${encodeURIComponent(action.action_id)}`);
      if (!alive()) return;
      show(result, h("p", { id: "bulk-undone", class: "notice", text: `Undone: bulk action ${answer.action.action_id} by ${byline(answer.action.undone_by, answer.action.undone_at)}; every box it changed is back to its review before.` }));
      preview.focus();
      await reload();
    } catch (error) {
      button.disabled = false;
      let text = error.message;
      if (error instanceof ApiError && error.reason === "STALE_REVISION") {
        text = "Some of its sightings were decided again since; undoing would overwrite those decisions, so nothing was undone.";
      }
      if (error instanceof ApiError && error.status === 401) failed(error);
      else show(problem, h("p", { class: "error", text: `Not undone: ${text}` }));
    }
  }

  const form = h(
    "form", { class: "bulk-form", "aria-labelledby": "bulk-title" },
    h("label", { for: "bulk-decision", text: "Decision for every matching sighting" }),
    h("div", { class: "actions" }, decision, preview),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    previewIt();
  });
  const node = h(
    "section", { id: "bulk", class: "panel bulk" },
    h("h2", { id: "bulk-title", text: "Bulk action on these filters" }),
    h("p", { class: "muted", text: "Previews how many sightings and items change, then asks before applying; one undo for the whole action." }),
    form, result, problem,
  );
  return { node, classesChanged: fillDecisions };
}

// The buckets (#/buckets: each with its counts, its browser and its review queue) and a
// bucket's browser (#/buckets/<bucket_id>?state=...&class_name=...): a grid of its items,
// a page of 200 at a time (GET /api/workshop/buckets/{id}/items, oldest frame first), each
// a thumbnail with its boxes after review drawn (their classes in its caption). Paging is by the listing's
// keyset token, never an offset: Next page asks for the page after the last token, and a
// stack of the tokens seen serves Previous page, so page 5,000 costs what page 1 does and
// only one page is ever in the DOM. The grid is one tab stop; arrows move in it, Home and
// End go to its ends, Enter opens the item in the item editor (full size, its history:
// result → corrections → decisions). The filters live in the URL (filters.js).
import { api, ApiError, currentSession } from "./api.js";
import { h, placed, show } from "./dom.js";
import { apiQuery, classesOfRun, describeFilter, filterForm, ITEM_FIELDS, listBuckets } from "./filters.js";
import { ItemEditor } from "./item_editor.js";
import { sessionEnded } from "./nav.js";
import { bucketList } from "./queue.js";
import { accountBar } from "./runs.js";

const PAGE_SIZE = 200;
const bucketPath = (bucketId) => `/api/workshop/buckets/${encodeURIComponent(bucketId)}`;
const utcTime = (timestamp) => new Date(timestamp).toISOString().slice(0, 19).replace("T", " ");

async function listView({ main, account, alive }) {
  const session = await currentSession();
  const buckets = await listBuckets();
  if (!alive()) return;
  accountBar(account, session);
  const heading = h("h1", { tabindex: "-1", text: "Buckets" });
  show(main, heading, h("p", { text: "A bucket is a dataset: the frames full runs saved into it, with their reviewed boxes." }), bucketList(buckets, "bucket-list"));
  document.title = "Buckets · Workshop";
  heading.focus();
}

/** The boxes a thumbnail shows: the item's boxes after review, the rejected left out. */
export function shownBoxes(item) {
  return (item.reviewed_boxes || []).filter((r) => r.review_state !== "rejected").map((r) => r.box);
}

function itemWords(item, classes, when) {
  const marks = [item.correction ? "corrected" : null, item.item_decision ? "decided alone" : null].filter(Boolean);
  return `${item.camera_id} at ${when} UTC, ${item.review_state}` +
    `${classes.length ? `, ${classes.join(", ")}` : ", no boxes"}${marks.length ? ` (${marks.join(", ")})` : ""}`;
}

// A grid cell's nodes, made once and cloned for each item of a page: a clone is cheaper
// than building its ten nodes one by one, and a page is 200 of them. Its button's clicks
// and focus are the grid's (one listener each, not 400).
let cellTemplate = null;
function emptyCell() {
  cellTemplate ||= h(
    "li", { class: "item-cell" },
    h("button", { type: "button", class: "item-open", tabindex: "-1" },
      h("span", { class: "frame" },
        h("img", { decoding: "async", width: 160, height: 90, alt: "" }),
        h("span", { class: "boxes" }))),
    h("span", { class: "item-caption" },
      h("span", { class: "state" }), h("span", { class: "item-classes" }), h("span", { class: "item-when" })),
  );
  return cellTemplate.cloneNode(true);
}

/** The grid's cell of `item`, the `index`th of its page. Nothing here reads layout, and the
 * outlines are placed in percentages, so a page of 200 costs one layout (boxes.js's labels,
 * placed in pixels, are the full-size view's). */
function itemCell(item, index, focusable) {
  const node = emptyCell();
  const button = node.firstChild;
  const [img, layer] = button.firstChild.children;
  const [state, classesText, when] = node.lastChild.children;
  const boxes = shownBoxes(item);
  const classes = [...new Set(boxes.map((b) => b.class_name))];
  const time = utcTime(item.frame_time);
  node.dataset.itemId = item.item_id;
  button.dataset.index = String(index);
  button.tabIndex = focusable ? 0 : -1;
  button.setAttribute("aria-label", `Open ${itemWords(item, classes, time)}`);
  img.dataset.src = `/api/workshop/runs/${encodeURIComponent(item.run_id)}/items/${encodeURIComponent(item.item_id)}/image`;
  for (const box of boxes) {
    const outline = document.createElement("span");
    outline.className = "box";
    layer.append(placed(outline, box));
  }
  state.className = `state state-${item.review_state}`;
  state.textContent = item.review_state;
  classesText.textContent = classes.join(", ") || "no boxes";
  when.title = `${time} UTC`;
  when.textContent = `${item.camera_id} ${time.slice(5)}`;
  return node;
}

// Thumbnails load once their cell comes within NEAR of the viewport, through one
// IntersectionObserver for the grid (its callback is a task of its own, after the frame
// that drew the cells). Chromium's own loading="lazy" reaches 1,250 px or more below the
// viewport, so a page of 200 started about 84 image requests, each begun in a microtask at
// the end of the frame that painted the grid (19-22 ms of it, measured in a trace); this
// asks for the 40-60 cells in and near view, and the rest as the grid is scrolled to them.
const NEAR = "300px 0px";
function thumbnails() {
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      observer.unobserve(entry.target);
      const img = entry.target.querySelector("img");
      img.src = img.dataset.src;
    }
  }, { rootMargin: NEAR });
  return {
    // the cell, not its image: a cell out of view is not laid out inside
    // (content-visibility: auto), so its image has no place to intersect with
    watch: (cell) => observer.observe(cell),
    forget: () => observer.disconnect(),
  };
}

/** For bench/bucket_browser.py: `bucket-page` from asking for a page to its items in the
 * DOM, `bucket-page-painted` to the task after the next frame (styled, laid out, painted). */
function measured(started) {
  performance.measure("bucket-page", { start: started, end: performance.now() });
  requestAnimationFrame(() => setTimeout(() => {
    performance.measure("bucket-page-painted", { start: started, end: performance.now() });
  }));
}

export async function bucketsView(context) {
  if (!context.id) return listView(context);
  const { main, account, id: bucketId, params, alive } = context;
  const pageSize = Number(params.get("page_size")) || PAGE_SIZE;
  const base = `#/buckets/${encodeURIComponent(bucketId)}`;
  const query = apiQuery(params, ITEM_FIELDS);
  const session = await currentSession();

  const heading = h("h1", { tabindex: "-1", text: `Bucket ${bucketId}` });
  const where = h("p", { id: "browser-page", class: "progress", "aria-live": "polite" });
  const failure = h("div", { id: "browser-error", role: "alert" });
  const grid = h("ul", { id: "item-grid", class: "item-grid", "aria-label": "Items of this page", "aria-describedby": "grid-keys" });
  const previous = h("button", { type: "button", id: "previous-page", class: "secondary", text: "Previous page", onclick: () => turn(-1) });
  const next = h("button", { type: "button", id: "next-page", class: "secondary", text: "Next page", onclick: () => turn(1) });
  const firstPage = h("button", { type: "button", id: "first-page", class: "secondary", text: "First page", onclick: () => turn(0) });
  const editor = new ItemEditor();
  // `page` in the URL: start at that listing token (a link to a position deep in the
  // bucket); pages are then counted from there.
  let startToken = params.get("page") || "";
  const tokens = [startToken]; // tokens[n]: the token of page n+1 (the first page's is empty)
  let pageIndex = 0;
  let nextToken = "";
  let shown = []; // the page's items
  let focused = 0;

  async function fetchPage(token) {
    const asked = performance.now();
    const page = await api("GET", `${bucketPath(bucketId)}/items?${query}`, { query: { page_size: pageSize, page_token: token } });
    performance.measure("bucket-fetch", { start: asked, end: performance.now() });
    return page;
  }

  const loads = thumbnails();
  const cell = (item, index) => {
    const node = itemCell(item, index, index === focused);
    loads.watch(node);
    return node;
  };
  grid.addEventListener("click", (event) => {
    const button = event.target instanceof Element && event.target.closest(".item-open");
    if (button) openItem(Number(button.dataset.index));
  });
  grid.addEventListener("focusin", (event) => {
    const button = event.target instanceof Element && event.target.closest(".item-open");
    if (button) focused = Number(button.dataset.index);
  });

  function render() {
    focused = Math.min(focused, Math.max(0, shown.length - 1));
    loads.forget(); // the page's cells not yet near the view are not loaded
    const cells = document.createDocumentFragment();
    shown.forEach((item, index) => cells.append(cell(item, index)));
    grid.replaceChildren(cells);
    const start = pageIndex * pageSize + 1;
    const from = startToken ? " from the linked position" : "";
    where.textContent = shown.length
      ? `Page ${pageIndex + 1}${from}: items ${start} to ${start + shown.length - 1}${nextToken ? "" : " (the last page)"}.`
      : "No items match.";
    previous.disabled = pageIndex === 0;
    firstPage.disabled = pageIndex === 0 && !startToken;
    next.disabled = !nextToken;
  }

  /** -1: the previous page, 1: the next, 0: the first. */
  async function turn(step) {
    const target = step === 0 ? 0 : pageIndex + step;
    if (step === 0 && startToken) {
      startToken = ""; // First page: the bucket's, not the linked one
      tokens.length = 1;
      tokens[0] = "";
    }
    if (target < 0 || (step > 0 && !nextToken)) return;
    if (step > 0 && tokens.length <= target) tokens.push(nextToken);
    for (const button of [previous, next, firstPage]) button.disabled = true;
    try {
      const started = performance.now();
      const page = await fetchPage(tokens[target]);
      if (!alive()) return;
      pageIndex = target;
      tokens.length = pageIndex + 1; // a page fetched again may have a new successor
      shown = page.items;
      nextToken = page.next_page_token;
      focused = 0;
      show(failure);
      render();
      grid.querySelector("[tabindex='0']")?.focus({ preventScroll: true });
      window.scrollTo({ top: grid.offsetTop - 80 });
      measured(started);
    } catch (error) {
      if (!alive()) return;
      if (error instanceof ApiError && error.status === 401) sessionEnded();
      else show(failure, h("p", { class: "error", text: error.message }));
      render();
    }
  }

  function focusCell(index) {
    const buttons = grid.querySelectorAll(".item-open");
    if (!buttons.length) return;
    const target = Math.max(0, Math.min(buttons.length - 1, index));
    buttons[focused]?.setAttribute("tabindex", "-1");
    focused = target;
    buttons[target].setAttribute("tabindex", "0");
    buttons[target].focus();
  }

  function columns() {
    const cells = grid.children;
    if (cells.length < 2) return 1;
    const top = cells[0].offsetTop;
    let count = 1;
    while (count < cells.length && cells[count].offsetTop === top) count += 1;
    return count;
  }

  grid.addEventListener("keydown", (event) => {
    if (!(event.target instanceof Element) || !event.target.closest(".item-open")) return;
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const moves = {
      ArrowLeft: -1, ArrowRight: 1, ArrowUp: -columns(), ArrowDown: columns(),
      Home: -focused, End: shown.length - 1 - focused,
    };
    if (!(event.key in moves)) return;
    event.preventDefault();
    focusCell(focused + moves[event.key]);
  });

  async function openItem(index) {
    const item = shown[index];
    try {
      const classes = await classesOfRun(item.run_id);
      if (!alive()) return;
      editor.open({
        item, runId: item.run_id, classes,
        opener: () => grid.querySelector(`.item-open[data-index="${index}"]`),
        onChange: (changed) => {
          shown[index] = changed;
          const old = grid.children[index];
          if (old) old.replaceWith(cell(changed, index));
        },
      });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) sessionEnded();
      else show(failure, h("p", { class: "error", text: error.message }));
    }
  }

  const started = performance.now();
  const first = await fetchPage(startToken);
  if (!alive()) return;
  accountBar(account, session);
  shown = first.items;
  nextToken = first.next_page_token;

  const exportQuery = (format) => {
    const q = apiQuery(params, ITEM_FIELDS);
    q.set("format", format);
    return `${bucketPath(bucketId)}/export?${q}`;
  };
  render();
  show(
    main,
    heading,
    h("p", { class: "muted" },
      `${describeFilter(params, ITEM_FIELDS, "")}, oldest frame first. `,
      h("a", { href: `#/queue/${encodeURIComponent(bucketId)}`, text: "Review queue of this bucket" })),
    filterForm({ base, params, fields: ITEM_FIELDS, fallbackState: "", keep: ["page_size"] }),
    h("p", { id: "grid-keys", class: "muted", text: "In the grid: arrows move, Home and End go to the first and last item, Enter opens the item full size with its history." }),
    h("div", { class: "pages" }, firstPage, previous, where, next),
    failure,
    grid,
    h(
      "section", { id: "bucket-export", class: "panel", "aria-labelledby": "export-title" },
      h("h2", { id: "export-title", text: "Download" }),
      h("p", {},
        "These items (the filters above) as a dataset archive: ",
        h("a", { id: "export-coco", href: exportQuery("coco"), download: "", text: "COCO" }), " or ",
        h("a", { id: "export-yolo", href: exportQuery("yolo"), download: "", text: "YOLO" }),
        " (not a version: made again, it follows later decisions)."),
      h("p", {},
        "A reproducible dataset: ",
        h("a", { id: "bucket-datasets", href: `#/datasets/${encodeURIComponent(bucketId)}`, text: "this bucket's dataset versions" }),
        " (freeze a version, export it with progress, compare two)."),
    ),
    editor.node,
  );
  document.title = `Bucket ${bucketId} · Workshop`;
  heading.focus();
  measured(started);
  performance.mark("bucket-shown");
}

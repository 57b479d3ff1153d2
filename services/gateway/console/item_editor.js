// One bucket item in a modal dialog (the review page opens it from a frame): its boxes
// corrected by mouse or keyboard, saved as a correction (POST /api/workshop/items/{id}/correction,
// with the item's revision), the last correction undone, and a decision on this frame alone
// (POST/DELETE .../decision) that overrides its sighting's (docs/review.md, "Corrections"
// and "Item decisions"). A correction never changes the detected boxes: the dialog starts
// from the correction in force, else from the detections.
//
// Keys on a selected box: arrows move it, Shift+arrows resize it (1% of the frame; with
// Alt, 10%), Delete removes it; Tab goes from box to box. Anywhere in the dialog: a adds a
// box of the chosen class, s saves, u undoes the last correction, c / n decide this frame
// alone, f makes it follow its sighting again (`shortcuts`).
import { api, ApiError } from "./api.js";
import { h, placed, show } from "./dom.js";

const STEP = 0.01;
const BIG_STEP = 0.1;
const MIN_SIDE = 0.005;
const NEW_SIDE = 0.2;

const clamp = (value, low, high) => Math.min(high, Math.max(low, value));
const percent = (value) => `${Math.round(value * 1000) / 10}%`;
const itemPath = (itemId) => `/api/workshop/items/${encodeURIComponent(itemId)}`;

/** Who and when, as the page shows a decision or a correction. */
export function byline(principal, at) {
  const who = principal ? principal.display_name || principal.user_id || principal.key_id || "someone" : "someone";
  return at ? `${who}, ${new Date(at).toISOString().slice(0, 16).replace("T", " ")} UTC` : who;
}

/** The boxes an editor starts from: the correction in force, else the detections. */
export function editableBoxes(item) {
  if (item.correction) {
    return item.correction.boxes.map((corrected) => ({
      source: corrected.source_box_index, class_name: corrected.box.class_name,
      x: corrected.box.x, y: corrected.box.y, w: corrected.box.w, h: corrected.box.h,
    }));
  }
  return item.boxes.map((box, index) => ({
    source: index, class_name: box.class_name, x: box.x, y: box.y, w: box.w, h: box.h,
  }));
}

/** A box kept inside the frame and never smaller than MIN_SIDE. */
export function contained(box) {
  const w = clamp(box.w, MIN_SIDE, 1);
  const h2 = clamp(box.h, MIN_SIDE, 1);
  return { ...box, w, h: h2, x: clamp(box.x, 0, 1 - w), y: clamp(box.y, 0, 1 - h2) };
}

function decisionWords(state, relabel) {
  if (state === "accepted") return relabel ? `accepted as ${relabel}` : "accepted";
  return state === "rejected" ? "rejected (none)" : state;
}

const boxCount = (n) => `${n} box${n === 1 ? "" : "es"}`;

/** GetBucketItem's history as a list, oldest first: the result, each correction and undo,
 * each decision on the frame alone, each sighting's last decision; then the dataset
 * versions holding the item (ListItemVersions' first page). */
export function itemLog(history, held) {
  const events = [{ at: history.item.saved_at, text: `Saved with ${boxCount(history.item.boxes.length)} detected.` }];
  for (const c of history.corrections) {
    events.push({ at: c.corrected_at, text: `Revision ${c.revision}: corrected to ${boxCount(c.boxes.length)} by ${byline(c.corrected_by, c.corrected_at)}.` });
    if (c.undone_at) events.push({ at: c.undone_at, text: `Revision ${c.revision}'s correction undone by ${byline(c.undone_by, c.undone_at)}.` });
  }
  for (const d of history.item_decisions) {
    const what = d.review_state === "unspecified"
      ? "the frame's own decision cleared (it follows its sighting again)"
      : `this frame ${decisionWords(d.review_state, d.relabel_class)}`;
    events.push({ at: d.decided_at, text: `Revision ${d.revision}: ${what} by ${byline(d.decided_by, d.decided_at)}.` });
  }
  const undecided = [];
  for (const s of history.sightings) {
    const name = `Its ${s.class_name || "empty-frame"} sighting (${s.item_ids.length} frame${s.item_ids.length === 1 ? "" : "s"})`;
    if (s.decided_at) events.push({ at: s.decided_at, text: `${name}: ${decisionWords(s.review_state, s.relabel_class)} by ${byline(s.decided_by, s.decided_at)}.` });
    else undecided.push(`${name}: not decided yet.`);
  }
  events.sort((a, b) => Date.parse(a.at) - Date.parse(b.at)); // stable: ties keep their order
  const versions = held.versions || [];
  return [
    h("h4", { text: "Every change, oldest first" }),
    h("ol", { class: "history-list" }, [...events.map((e) => e.text), ...undecided].map((text) => h("li", { text }))),
    h("p", { id: "history-versions" }, versions.length
      ? `In dataset version${versions.length === 1 ? "" : "s"} ${versions.map((v) => `“${v.name}”`).join(", ")}${held.next_page_token ? " and more" : ""}.`
      : "In no dataset version."),
  ];
}

export class ItemEditor {
  constructor() {
    this.title = h("h2", { id: "item-editor-title" });
    this.img = h("img", { alt: "" });
    this.layer = h("span", { class: "edit-layer", "aria-label": "Boxes" });
    this.frame = h("span", { class: "frame editing" }, this.img, this.layer);
    this.status = h("div", { id: "item-editor-status", role: "status" });
    this.failure = h("div", { id: "item-editor-error", role: "alert" });
    this.classPick = h("select", { id: "box-class" });
    this.history = h("div", { id: "item-history", class: "item-history" });
    // Every change of the item, oldest first, and the versions holding it (GET .../items/{id}
    // and .../versions), read after the dialog opens and after each change made in it.
    this.log = h("div", { id: "history-log" });
    this.logAsked = 0;
    this.decisionPick = h("select", { id: "item-relabel" });
    const close = h("button", { type: "button", class: "secondary", text: "Close" });
    this.save = h("button", { type: "button", id: "save-correction", "aria-keyshortcuts": "s", text: "Save boxes", onclick: () => this.saveBoxes() });
    this.undoButton = h("button", {
      type: "button", id: "undo-correction", class: "secondary", "aria-keyshortcuts": "u", text: "Undo last correction",
      onclick: () => this.undoCorrection(),
    });
    this.node = h(
      "dialog", { id: "item-editor", class: "full-size item-editor", "aria-labelledby": "item-editor-title" },
      h("div", { class: "full-size-head" }, this.title, close),
      this.frame,
      h(
        "div", { class: "editor-panel" },
        h(
          "div", { class: "editor-row", role: "group", "aria-label": "Boxes of this frame" },
          h("label", { for: "box-class", text: "Class" }), this.classPick,
          h("button", { type: "button", id: "add-box", class: "secondary", "aria-keyshortcuts": "a", text: "Add box", onclick: () => this.addBox() }),
          h("button", { type: "button", id: "delete-box", class: "secondary", "aria-keyshortcuts": "Delete", text: "Delete box", onclick: () => this.deleteBox() }),
          this.save, this.undoButton,
        ),
        h(
          "div", { class: "editor-row", role: "group", "aria-label": "Decide this frame alone" },
          h("button", { type: "button", id: "item-confirm", "aria-keyshortcuts": "c", text: "Confirm frame", onclick: () => this.decideItem({ decision: "confirm" }) }),
          h("button", { type: "button", id: "item-none", "aria-keyshortcuts": "n", text: "None for frame", onclick: () => this.decideItem({ decision: "none" }) }),
          h("label", { for: "item-relabel", text: "Relabel frame to" }), this.decisionPick,
          h("button", {
            type: "button", id: "item-relabel-go", text: "Relabel frame",
            onclick: () => this.decideItem({ decision: "relabel", class_name: this.decisionPick.value }),
          }),
          h("button", { type: "button", id: "item-follow", class: "secondary", "aria-keyshortcuts": "f", text: "Follow the sighting", onclick: () => this.clearDecision() }),
        ),
        h("p", { class: "muted", text: "Arrows move the selected box, Shift+arrows resize it (Alt: by 10%), Delete removes it, a adds one, s saves, u undoes the last correction; c, n confirm or decide None for this frame alone, f makes it follow its sighting again. Drag a box to move it, its corner to resize it, or the picture to draw one." }),
        this.history, this.status, this.failure,
      ),
    );
    // The editor's own keys (the review page's are off while it is open).
    this.shortcuts = {
      a: () => this.addBox(),
      s: () => this.dirty && this.saveBoxes(),
      u: () => this.item.correction && this.undoCorrection(),
      c: () => this.decideItem({ decision: "confirm" }),
      n: () => this.decideItem({ decision: "none" }),
      f: () => this.item.item_decision && this.clearDecision(),
    };
    this.opener = null;
    this.item = null;
    this.boxes = [];
    this.selected = -1;
    this.dirty = false;
    close.addEventListener("click", () => this.node.close());
    this.node.addEventListener("close", () => {
      // the page may have drawn the opener again (a save re-renders its rows)
      const opener = typeof this.opener === "function" ? this.opener() : this.opener;
      if (opener && opener.isConnected) opener.focus();
    });
    this.node.addEventListener("keydown", (event) => this.onkey(event));
    this.classPick.addEventListener("change", () => {
      if (this.selected < 0) return;
      this.boxes[this.selected].class_name = this.classPick.value;
      this.changed();
    });
    this.layer.addEventListener("pointerdown", (event) => this.onpointer(event));
    this.img.addEventListener("load", () => this.fit());
  }

  /** Opens `item` of run `runId`; `classes` are the run's models' (GetReview's models);
   * `onChange(item)` gets the item as the server stored it after each save; `opener` (an
   * element, or a function finding it) gets the focus back on close. */
  open({ item, runId, classes, opener, onChange }) {
    this.item = item;
    this.runId = runId;
    this.onChange = onChange;
    this.opener = opener;
    this.classes = classes;
    show(this.classPick, classes.map((name) => h("option", { value: name, text: name })));
    show(this.decisionPick, classes.map((name) => h("option", { value: name, text: name })));
    const src = `/api/workshop/runs/${encodeURIComponent(runId)}/items/${encodeURIComponent(item.item_id)}/image`;
    if (this.img.getAttribute("src") !== src) this.img.src = src;
    this.img.alt = `Frame of ${item.camera_id} at ${item.frame_time}`;
    this.fit();
    this.reset(item);
    show(this.status);
    show(this.failure);
    if (!this.node.open) this.node.showModal();
    this.focusBox(this.boxes.length ? 0 : -1);
    this.readLog();
  }

  async readLog() {
    const asked = ++this.logAsked;
    const path = itemPath(this.item.item_id);
    show(this.log, h("p", { class: "muted", text: "Reading its history…" }));
    try {
      const [history, held] = await Promise.all([
        api("GET", path), api("GET", `${path}/versions`, { query: { page_size: 20 } }),
      ]);
      if (asked === this.logAsked) show(this.log, ...itemLog(history, held));
    } catch (error) {
      if (asked === this.logAsked) show(this.log, h("p", { class: "error", text: `History not read: ${error.message}` }));
    }
  }

  reset(item) {
    this.item = item;
    this.boxes = editableBoxes(item);
    this.dirty = false;
    this.selected = Math.min(this.selected, this.boxes.length - 1);
    this.title.textContent = `Frame ${item.item_id} · ${item.camera_id}`;
    this.render();
    this.renderHistory();
  }

  fit() {
    const { naturalWidth: width, naturalHeight: height } = this.img;
    if (width && height) this.frame.style.setProperty("--ratio", String(width / height));
  }

  changed() {
    this.dirty = true;
    this.render();
  }

  render() {
    const nodes = this.boxes.map((box, index) => {
      const node = h("button", {
        type: "button", class: `edit-box${index === this.selected ? " selected" : ""}`,
        "data-box-index": index,
        "aria-pressed": String(index === this.selected),
        "aria-label": `${box.class_name} box ${index + 1} of ${this.boxes.length}${box.source < 0 ? " (added)" : ""}, at ${percent(box.x)}, ${percent(box.y)}, ${percent(box.w)} by ${percent(box.h)}`,
        onfocus: () => this.select(index),
      }, h("span", { class: "edit-box-label", text: box.class_name }), h("span", { class: "edit-handle", "data-handle": "resize" }));
      return placed(node, box);
    });
    this.layer.replaceChildren(...nodes);
    this.save.disabled = !this.dirty;
    this.undoButton.disabled = !this.item.correction;
    if (this.selected >= 0 && this.boxes[this.selected]) this.classPick.value = this.boxes[this.selected].class_name;
  }

  renderHistory() {
    const item = this.item;
    const lines = [h("li", {}, `Detected: ${item.boxes.length} box${item.boxes.length === 1 ? "" : "es"} (kept as they were).`)];
    if (item.correction) {
      lines.push(h("li", { id: "history-correction" }, `Corrected to ${item.correction.boxes.length} box${item.correction.boxes.length === 1 ? "" : "es"} by ${byline(item.correction.corrected_by, item.correction.corrected_at)}.`));
    }
    const decision = item.item_decision;
    if (decision) {
      const what = decision.review_state === "accepted"
        ? decision.relabel_class ? `accepted as ${decision.relabel_class}` : "accepted"
        : "rejected (none)";
      lines.push(h("li", { id: "history-decision" }, `This frame ${what} by ${byline(decision.decided_by, decision.decided_at)}; it overrides the sighting's decision.`));
    } else {
      lines.push(h("li", { id: "history-decision" }, `This frame follows its sighting: ${item.review_state}.`));
    }
    show(this.history, h("h3", { text: "History" }), h("ol", { class: "history-list" }, lines), this.log);
  }

  select(index) {
    if (index === this.selected) return;
    this.selected = index;
    for (const node of this.layer.children) {
      const mine = Number(node.dataset.boxIndex) === index;
      node.classList.toggle("selected", mine);
      node.setAttribute("aria-pressed", String(mine));
    }
    if (index >= 0 && this.boxes[index]) this.classPick.value = this.boxes[index].class_name;
  }

  focusBox(index) {
    this.select(index);
    const node = this.layer.querySelector(`[data-box-index="${index}"]`);
    if (node) node.focus();
  }

  addBox() {
    const start = NEW_SIDE / 2;
    this.boxes.push(contained({ source: -1, class_name: this.classPick.value || this.classes[0] || "object", x: 0.5 - start, y: 0.5 - start, w: NEW_SIDE, h: NEW_SIDE }));
    this.changed();
    this.focusBox(this.boxes.length - 1);
    this.say(`Added a ${this.boxes[this.boxes.length - 1].class_name} box; move it with the arrows.`);
  }

  deleteBox() {
    if (this.selected < 0 || !this.boxes[this.selected]) return;
    const [gone] = this.boxes.splice(this.selected, 1);
    this.changed();
    this.focusBox(Math.min(this.selected, this.boxes.length - 1));
    this.say(`Deleted the ${gone.class_name} box.`);
  }

  nudge(index, dx, dy, resize) {
    const box = this.boxes[index];
    this.boxes[index] = contained(resize
      ? { ...box, w: box.w + dx, h: box.h + dy }
      : { ...box, x: box.x + dx, y: box.y + dy });
    this.changed();
    this.focusBox(index);
  }

  onkey(event) {
    if (event.target instanceof Element && event.target.closest("select, input")) return;
    if (event.ctrlKey || event.metaKey) return;
    const onBox = event.target instanceof Element && event.target.closest(".edit-box");
    const step = event.altKey ? BIG_STEP : STEP;
    const moves = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, -step], ArrowDown: [0, step] };
    if (onBox && moves[event.key]) {
      const [dx, dy] = moves[event.key];
      this.nudge(this.selected, dx, dy, event.shiftKey);
    } else if (onBox && (event.key === "Delete" || event.key === "Backspace")) {
      this.deleteBox();
    } else if (!event.altKey && !event.shiftKey && this.shortcuts[event.key]) {
      this.shortcuts[event.key]();
    } else {
      return;
    }
    event.preventDefault();
  }

  onpointer(event) {
    const rect = this.layer.getBoundingClientRect();
    if (!rect.width || !rect.height) return;
    const at = (e) => ({ x: clamp((e.clientX - rect.left) / rect.width, 0, 1), y: clamp((e.clientY - rect.top) / rect.height, 0, 1) });
    const start = at(event);
    const target = event.target instanceof Element ? event.target.closest(".edit-box") : null;
    let index;
    let mode;
    if (target) {
      index = Number(target.dataset.boxIndex);
      mode = event.target.closest("[data-handle]") ? "resize" : "move";
    } else {
      this.boxes.push({ source: -1, class_name: this.classPick.value || this.classes[0] || "object", x: start.x, y: start.y, w: MIN_SIDE, h: MIN_SIDE });
      index = this.boxes.length - 1;
      mode = "draw";
    }
    const origin = { ...this.boxes[index] };
    this.focusBox(index);
    event.preventDefault();
    const moveTo = (e) => {
      const now = at(e);
      const dx = now.x - start.x;
      const dy = now.y - start.y;
      if (mode === "move") this.boxes[index] = contained({ ...origin, x: origin.x + dx, y: origin.y + dy });
      else if (mode === "resize") this.boxes[index] = contained({ ...origin, w: origin.w + dx, h: origin.h + dy });
      else this.boxes[index] = contained({ ...origin, x: Math.min(start.x, now.x), y: Math.min(start.y, now.y), w: Math.abs(dx), h: Math.abs(dy) });
      this.changed();
    };
    const end = () => {
      window.removeEventListener("pointermove", moveTo);
      window.removeEventListener("pointerup", end);
      this.focusBox(index);
    };
    window.addEventListener("pointermove", moveTo);
    window.addEventListener("pointerup", end);
  }

  say(text) {
    show(this.failure);
    show(this.status, h("p", { class: "notice", text }));
  }

  fail(error) {
    show(this.status);
    let text = error.message;
    if (error instanceof ApiError && error.reason === "STALE_REVISION") {
      text = "Someone changed this frame since it was shown; close it and reload the page to see their change (yours is not saved).";
    }
    show(this.failure, h("p", { class: "error", text: `Not saved: ${text}` }));
  }

  async send(method, suffix, options, done) {
    try {
      const answer = await api(method, `${itemPath(this.item.item_id)}/${suffix}`, options);
      this.selected = -1;
      this.reset(answer.item);
      if (this.onChange) this.onChange(answer.item);
      this.say(done);
      this.focusBox(this.boxes.length ? 0 : -1);
      this.readLog();
    } catch (error) {
      this.fail(error);
    }
  }

  saveBoxes() {
    const boxes = this.boxes.map((box) => ({
      source_box_index: box.source, class_name: box.class_name, x: box.x, y: box.y, w: box.w, h: box.h,
    }));
    return this.send("POST", "correction", { body: { boxes, expected_revision: this.item.revision } },
      `Saved ${boxes.length} box${boxes.length === 1 ? "" : "es"} as a correction.`);
  }

  undoCorrection() {
    return this.send("DELETE", "correction", { query: { expected_revision: this.item.revision } },
      "Undone: the correction before it (or the detections) is in force again.");
  }

  decideItem(body) {
    return this.send("POST", "decision", { body: { ...body, expected_revision: this.item.revision } },
      body.decision === "relabel" ? `This frame is accepted as ${body.class_name}.` : body.decision === "none" ? "This frame is decided None." : "This frame is confirmed.");
  }

  clearDecision() {
    return this.send("DELETE", "decision", { query: { expected_revision: this.item.revision } },
      "This frame follows its sighting again.");
  }
}

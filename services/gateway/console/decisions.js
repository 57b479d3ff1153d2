// Deciding sightings from the keyboard, one way for the review page (review.js) and the
// review queue (queue.js): j/k move the current sighting, c / n / 1-9 decide it through
// its POST .../sightings/{id}/decision (shown as made only once the server answered that
// it stored it; one decision at a time), u undoes this page's decisions newest first, e
// opens the page's item editor. The same decisions as buttons (a pointer, or a screen
// reader's browse mode, which keeps the letter keys), and the two live regions that say
// what happened. The page keeps its rows and what it shows; this keeps which row is
// current, which decision is being saved and what each decision replaced.
import { api, ApiError } from "./api.js";
import { h, show } from "./dom.js";
import { sessionEnded } from "./nav.js";

const DONE = { confirm: "Confirmed", none: "Decided None for", relabel: "Relabelled" };
// Keys typed into these are the field's, not decisions.
const TYPING = "input, select, textarea, dialog, form";

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** The decision that puts a sighting back to `before`, or null when none can: the API
 * has no decision that makes a sighting pending again. */
export function decisionRestoring(before) {
  if (before.review_state === "rejected") return { decision: "none" };
  if (before.review_state === "accepted") {
    return before.relabel_class
      ? { decision: "relabel", class_name: before.relabel_class }
      : { decision: "confirm" };
  }
  return null;
}

export class SightingDecisions {
  /**
   * `page`, what the page answers for:
   * - idPrefix: the live regions are `${idPrefix}-status` and `${idPrefix}-error`
   * - order, rows: the sighting ids as shown, and each one's <li> (the page's own, kept
   *   up to date by it)
   * - classes: the relabel keys' classes (the page's array; call classesChanged())
   * - sighting(id): the sighting as shown; describe(sighting): its words in messages
   * - decisionPath(id): where its decision is POSTed
   * - decided(id, answer): takes the stored decision into the page; returns how the
   *   message names the sighting
   * - joinedSince: when the items a decision took in unseen joined ("since ...")
   * - render(id): draws a row again (it asks saving(id)); settled(): after a decision
   * - hasMore(), loadMore(): the next page, for j past the last row
   * - edit(id): e, the item editor on that sighting; editHelp: what e does, in words
   * - alive(): whether the page is still the one shown
   */
  constructor(page) {
    this.page = page;
    this.current = -1; // index into page.order
    this.inFlight = null; // the sighting id whose decision is being stored
    this.undo = []; // {sightingId, before}: what each decision replaced, newest last
    // Live regions stay in the page (a region added or unhidden with its text is not
    // always announced); each holds the latest message, or nothing.
    this.announce = h("div", { id: `${page.idPrefix}-status`, role: "status" });
    this.failure = h("div", { id: `${page.idPrefix}-error`, role: "alert" });
    this.relabelKeys = h("ol", { id: "relabel-classes", class: "key-list", "aria-label": "Relabel to" });
    this.relabelTo = h("select", { id: "relabel-to" });
    this.relabel = h(
      "span", { class: "relabel" },
      h("label", { for: "relabel-to", text: "Relabel to" }), this.relabelTo,
      h("button", {
        type: "button", text: "Relabel",
        onclick: () => this.relabelTo.value && this.decide({ decision: "relabel", class_name: this.relabelTo.value }),
      }),
    );
    this.keys = h(
      "section", { class: "review-keys", "aria-labelledby": "keys-title" },
      h("h2", { id: "keys-title", text: "Keys" }),
      h(
        "ul", { class: "key-list" },
        h("li", {}, h("kbd", { text: "j" }), " / ", h("kbd", { text: "k" }), " next / previous sighting"),
        h("li", {}, h("kbd", { text: "c" }), " confirm"),
        h("li", {}, h("kbd", { text: "n" }), " none (the object is not there)"),
        h("li", {}, h("kbd", { text: "u" }), " undo the last decision"),
        h("li", {}, h("kbd", { text: "e" }), ` ${page.editHelp}`),
      ),
      this.relabelKeys,
    );
    this.actions = h(
      "div", { class: "review-actions", role: "group", "aria-label": "Decide the current sighting" },
      h("button", { type: "button", "aria-keyshortcuts": "c", onclick: () => this.decide({ decision: "confirm" }), text: "Confirm" }),
      h("button", { type: "button", "aria-keyshortcuts": "n", onclick: () => this.decide({ decision: "none" }), text: "None" }),
      this.relabel,
      h("button", { type: "button", class: "secondary", "aria-keyshortcuts": "u", onclick: () => this.undoLast(), text: "Undo" }),
    );
    this.onkey = this.onkey.bind(this);
    this.classesChanged();
  }

  /** The relabel keys and choices again, from page.classes (the first nine have keys). */
  classesChanged() {
    const classes = this.page.classes;
    this.relabelKeys.hidden = this.relabel.hidden = classes.length === 0;
    show(this.relabelKeys, classes.slice(0, 9).map((name, index) =>
      h("li", {}, h("kbd", { text: String(index + 1) }), ` relabel to ${name}`)));
    const chosen = this.relabelTo.value;
    show(this.relabelTo, classes.map((name, index) =>
      h("option", { value: name, text: index < 9 ? `${index + 1} ${name}` : name })));
    if (chosen) this.relabelTo.value = chosen;
  }

  say(text) {
    show(this.failure);
    show(this.announce, h("p", { class: "notice", text }));
  }

  fail(text) {
    show(this.announce);
    show(this.failure, h("p", { class: "error", text }));
  }

  /** A request that failed: a session that ended goes to the login page, else it is said. */
  failed(error, prefix = "") {
    if (!this.page.alive()) return;
    if (error instanceof ApiError && error.status === 401) sessionEnded();
    else this.fail(`${prefix}${error.message}`);
  }

  /** The current sighting's id; undefined when there is none. */
  currentId() {
    return this.page.order[this.current];
  }

  saving(sightingId) {
    return this.inFlight === sightingId;
  }

  /** No current sighting and nothing to undo (the page shows its list anew). */
  reset() {
    this.current = -1;
    this.undo.length = 0;
  }

  select(index) {
    const { order, rows } = this.page;
    if (order.length === 0) return;
    const old = this.current >= 0 ? rows.get(order[this.current]) : null;
    if (old) {
      old.classList.remove("current");
      old.removeAttribute("aria-current");
    }
    this.current = Math.max(0, Math.min(order.length - 1, index));
    const row = rows.get(order[this.current]);
    row.classList.add("current");
    row.setAttribute("aria-current", "true");
    row.focus({ preventScroll: true });
    row.scrollIntoView({ block: "nearest" });
  }

  async move(step) {
    const past = this.current + step >= this.page.order.length;
    if (step > 0 && past && this.page.hasMore()) await this.page.loadMore();
    this.select(this.current < 0 ? 0 : this.current + step);
  }

  async decide(body, { recordUndo = true, what = DONE[body.decision] } = {}) {
    const page = this.page;
    if (this.inFlight) {
      this.say("The last decision is still being saved; wait for it.");
      return;
    }
    if (this.current < 0) this.select(0);
    const sightingId = this.currentId();
    if (sightingId === undefined) return;
    const before = page.sighting(sightingId);
    if (body.decision === "relabel" && !before.class_name) {
      this.fail("A sighting without detections can be confirmed or decided None, not relabelled.");
      return;
    }
    this.inFlight = sightingId;
    show(this.failure);
    page.render(sightingId);
    try {
      const answer = await api("POST", page.decisionPath(sightingId), {
        body: { ...body, seen_item_count: before.item_ids.length },
      });
      if (!page.alive()) return;
      const named = page.decided(sightingId, answer);
      if (recordUndo) {
        this.undo.push({ sightingId, before: { review_state: before.review_state, relabel_class: before.relabel_class } });
      }
      let text = `${what} ${named}: ${plural(answer.items_updated, "item")} updated`;
      if (answer.sighting.relabel_class) text += `, now ${answer.sighting.relabel_class}`;
      text += ".";
      const joined = answer.items_joined;
      if (joined > 0) {
        text += ` ${plural(joined, "item")} joined the sighting ${page.joinedSince}; ` +
          `the decision includes ${joined === 1 ? "it" : "them"}.`;
      }
      this.say(text);
    } catch (error) {
      this.failed(error, "Not saved: ");
    } finally {
      if (this.inFlight === sightingId) this.inFlight = null;
      if (page.alive()) {
        page.render(sightingId);
        page.settled();
      }
    }
  }

  async undoLast() {
    if (this.inFlight) {
      this.say("The last decision is still being saved; wait for it.");
      return;
    }
    const last = this.undo.pop();
    if (!last) {
      this.say("Nothing to undo.");
      return;
    }
    this.select(this.page.order.indexOf(last.sightingId));
    const restoring = decisionRestoring(last.before);
    if (!restoring) {
      this.fail(
        `Cannot undo: ${this.page.describe(this.page.sighting(last.sightingId))} was pending before, ` +
        "and a decision cannot make a sighting pending again. Decide it again (c, n or 1–9).",
      );
      return;
    }
    await this.decide(restoring, { recordUndo: false, what: "Undone: back to" });
  }

  /** e: the page's item editor on the current sighting. */
  editCurrent() {
    if (this.current < 0) this.select(0);
    const sightingId = this.currentId();
    if (sightingId !== undefined) this.page.edit(sightingId);
  }

  /** The keys, from now until the page is left. */
  listen() {
    document.addEventListener("keydown", this.onkey);
  }

  onkey(event) {
    if (!this.page.alive()) {
      document.removeEventListener("keydown", this.onkey);
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.target instanceof Element && event.target.closest(TYPING)) return;
    const key = event.key;
    const classes = this.page.classes;
    if (key === "j") this.move(1);
    else if (key === "k") this.move(-1);
    else if (key === "c") this.decide({ decision: "confirm" });
    else if (key === "n") this.decide({ decision: "none" });
    else if (key === "u") this.undoLast();
    else if (key === "e") this.editCurrent();
    else if (/^[1-9]$/.test(key) && Number(key) <= classes.length) {
      this.decide({ decision: "relabel", class_name: classes[Number(key) - 1] });
    } else return;
    event.preventDefault();
  }
}

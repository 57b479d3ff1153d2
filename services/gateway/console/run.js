// The run page (#/run/<run_id>): one run's status and counts, why it waits, its jobs as
// strips of slots, its newest images with their boxes (shown by frame time; a click shows
// one full size), its timeline (each job's attempts), its provenance, Cancel and a test
// run's countdown. Live through the
// run's WebSocket (docs/live.md); when the socket closes before the run finished, the
// page polls GET run and says so.
//
// Speed: a live message carries the whole detail (up to 100 images), often several per
// second. The page keeps the latest and paints it once per animation frame, and reuses
// every node it made for a job or an image: a message changes text and classes and
// adds the new images, it never rebuilds the 100 that are already there.
import { ApiError, api, currentSession } from "./api.js";
import { drawBoxes, forgetBoxes, labelText } from "./boxes.js";
import { h, show } from "./dom.js";
import { FullSize } from "./full_size.js";
import { sessionEnded } from "./nav.js";
import { accountBar, age } from "./runs.js";

const FINAL = new Set(["completed", "failed", "cancelled", "expired"]);
const POLL_SECONDS = 3;
const WAITING_REFRESH_MS = 5000;
const TIMELINE_REFRESH_MS = 5000; // at most one GET timeline per this, when a job changed
const JOB_LIMIT = 100; // what the live channel sends; GET run asks for the same
const MAX_CELLS = 200; // a strip of a longer job draws each cell for several slots

const SLOT_WORDS = {
  frame: "frame",
  empty: "empty",
  dropped: "dropped",
  unseen: "no frame shown (empty or dropped)",
  processed: "processed, no frame yet",
  pending: "pending",
};

function runPath(runId) {
  return `/api/workshop/runs/${encodeURIComponent(runId)}`;
}

function imagePath(runId, image) {
  const kind = image.source === "item" ? "items" : "previews";
  return `${runPath(runId)}/${kind}/${encodeURIComponent(image.item_id)}/image`;
}

/** The detail's images (its newest, by when they were published or saved) in the order
 * the page shows them: by frame time, latest first; then by camera and item. */
export function byFrameTime(images) {
  return [...images].sort((a, b) => Date.parse(b.frame_time) - Date.parse(a.frame_time)
    || a.camera_id.localeCompare(b.camera_id) || a.item_id.localeCompare(b.item_id));
}

/** Whether the detail already shows a preview unreadable, so the page must not ask for
 * it: past its `expires_at`, or of a full run whose job is no longer leased (a full run's
 * previews expire when their job ends; its saved items replace them). */
export function previewExpired(image, { fullRun, jobStates, now }) {
  if (image.source !== "preview") return false;
  if (image.expires_at && Date.parse(image.expires_at) <= now) return true;
  const state = jobStates.get(image.job_id);
  return fullRun && state !== undefined && state !== "leased";
}

/** A frame's key: a full run's saved item takes over the node of its frame's preview. */
function frameKey(image) {
  return `${image.job_id}/${image.slot_index}`;
}

/** "59 min 12 s", "12 s" until `timestamp`; null once it passed. */
export function countdown(timestamp, now = Date.now()) {
  const seconds = Math.floor((Date.parse(timestamp) - now) / 1000);
  if (seconds < 0) return null;
  const m = Math.floor(seconds / 60);
  return m > 0 ? `${m} min ${seconds % 60} s` : `${seconds} s`;
}

function utc(timestamp) {
  return timestamp ? timestamp.replace("T", " ").replace(/(\.\d+)?Z$/, " UTC") : "";
}

function creator(principal) {
  if (!principal) return "someone";
  if (principal.user_id) return principal.display_name || principal.user_id;
  return principal.key_id ? `key ${principal.key_id}` : "an operator";
}

function percent(part, whole) {
  return whole > 0 ? Math.round((100 * part) / whole) : 0;
}

/** The outcome of each slot of a job, as far as the detail tells (see docs/console.md). */
export function slotStates(job, frames, counts, allFramesShown) {
  const n = job.slot_count;
  const states = new Array(n);
  let processed = Math.floor((n * job.progress_percent) / 100);
  for (const index of frames) processed = Math.max(processed, index + 1);
  let noFrame = "processed";
  if (job.state === "completed") {
    processed = n;
    if (!allFramesShown) noFrame = "unseen";
    else if (counts.slots_dropped === 0) noFrame = "empty";
    else if (counts.slots_empty === 0) noFrame = "dropped";
    else noFrame = "unseen";
  } else if (job.state !== "leased") {
    processed = 0; // queued again, failed, cancelled, expired: nothing of it is committed
  }
  for (let i = 0; i < n; i += 1) {
    states[i] = frames.has(i) ? "frame" : i < processed ? noFrame : "pending";
  }
  return states;
}

/** Groups slot states into at most MAX_CELLS cells: a frame wins, then pending. */
function cells(states) {
  if (states.length <= MAX_CELLS) return states.map((state, i) => [state, i, i]);
  const out = [];
  for (let c = 0; c < MAX_CELLS; c += 1) {
    const from = Math.floor((c * states.length) / MAX_CELLS);
    const to = Math.floor(((c + 1) * states.length) / MAX_CELLS) - 1;
    const group = states.slice(from, to + 1);
    const state = group.includes("frame") ? "frame" : group.includes("pending") ? "pending" : group[0];
    out.push([state, from, to]);
  }
  return out;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

/** One job's row: its strip of slots and its words; updated in place. */
class JobView {
  constructor(job) {
    this.strip = h("div", { class: "slots", role: "img" });
    this.title = h("span", { class: "job-title" });
    this.state = h("span", { class: "status" });
    this.words = h("span", { class: "job-words" });
    this.progress = h("progress", { max: "100", value: "0" });
    this.node = h(
      "li", { class: "job", "data-job-id": job.job_id },
      h("div", { class: "job-head" }, this.title, this.state, this.progress, this.words),
      this.strip,
    );
    this.signature = "";
  }

  update(job, states) {
    setText(this.title, `Job ${job.job_index + 1}: ${job.camera_id} · ${job.recording_id}`);
    setText(this.state, job.state);
    this.state.className = `status status-${job.state}`;
    this.progress.value = job.progress_percent;
    this.progress.setAttribute("aria-label", `Job ${job.job_index + 1} progress`);
    const words = [`${job.progress_percent}%`];
    if (job.state === "leased" && job.phase !== "unspecified") words.push(job.phase);
    words.push(job.generation > 0 ? `attempt ${job.generation}` : "not claimed yet");
    if (job.state === "leased" && job.lease_expires_at) {
      words.push(`lease until ${utc(job.lease_expires_at)}`);
    }
    if (job.decoder) words.push(`decoded by ${job.decoder}`);
    if (job.state === "failed") words.push(`${job.failure_reason}: ${job.failure_message}`);
    words.push(`changed ${utc(job.updated_at)}`);
    setText(this.words, words.join(" · "));
    const signature = states.join(",");
    if (signature === this.signature) return;
    this.signature = signature;
    const drawn = cells(states);
    while (this.strip.children.length > drawn.length) this.strip.lastChild.remove();
    while (this.strip.children.length < drawn.length) this.strip.append(h("span", { class: "slot" }));
    const tally = {};
    drawn.forEach(([state, from, to], i) => {
      const cell = this.strip.children[i];
      const name = `slot slot-${state}`;
      if (cell.className !== name) cell.className = name;
      const which = from === to ? `slot ${from + 1}` : `slots ${from + 1}-${to + 1}`;
      cell.title = `${which}: ${SLOT_WORDS[state]}`;
    });
    for (const state of states) tally[state] = (tally[state] || 0) + 1;
    const summary = Object.entries(tally).map(([state, n]) => `${n} ${SLOT_WORDS[state]}`).join(", ");
    this.strip.setAttribute("aria-label", `Slots of job ${job.job_index + 1}: ${summary}`);
  }
}

/** One image with its boxes, a button that shows it full size; the <img> is made once
 * and kept. An image the detail shows expired is never asked for: the node keeps it if
 * it is already on screen, else shows a placeholder that says so. */
class ImageView {
  constructor(runId, openFullSize) {
    this.runId = runId;
    this.img = this.newImg();
    this.layer = h("span", { class: "boxes" });
    this.placeholder = h("span", { class: "placeholder" });
    this.frame = h("button", { type: "button", class: "frame" });
    this.caption = h("figcaption", {});
    this.node = h("figure", { class: "image" }, this.frame, this.caption);
    this.url = "";
    this.failed = ""; // a URL that could not be loaded is not asked for again
    this.signature = "";
    this.image = null;
    this.frame.addEventListener("click", () => openFullSize(this));
  }

  newImg() {
    const img = h("img", { decoding: "async" });
    // A request that lost a race with the image's expiry (answered 404) shows as such.
    img.addEventListener("error", () => {
      if (img !== this.img || !this.url) return; // the page let go of it
      this.failed = this.url;
      this.unavailable("Image not available");
    });
    return img;
  }

  /** Lets go of the <img> and its load, if one is under way. Chromium keeps showing, and
   * so keeps loading, an image that is not complete yet even after its `src` changed, so
   * the element itself is replaced: an expired preview's request is then cancelled. */
  release() {
    const old = this.img;
    this.url = "";
    if (!old.getAttribute("src")) return;
    this.img = this.newImg();
    if (old.parentNode) old.replaceWith(this.img);
    old.removeAttribute("src");
  }

  /** Shows `image`; `expired`: the detail shows it unreadable (see previewExpired). */
  update(image, expired) {
    this.image = image;
    this.node.dataset.itemId = image.item_id;
    this.node.dataset.source = image.source;
    const url = imagePath(this.runId, image);
    const name = `${image.camera_id} at ${utc(image.frame_time)}`;
    if (url === this.failed) this.unavailable("Image not available");
    else if (!expired) this.showImage(url, name);
    else if (!(url === this.url && this.loaded())) this.unavailable("Preview expired");
    const signature = JSON.stringify(image.boxes);
    if (signature !== this.signature) {
      this.signature = signature;
      // Boxes are fractions of the frame; as percentages of the layer, which covers
      // exactly the displayed image, they scale with it (boxes.js places the labels).
      drawBoxes(this.layer, image.boxes);
    }
    const labels = image.boxes.map(labelText);
    setText(
      this.caption,
      `${image.camera_id} · ${utc(image.frame_time)} · slot ${image.slot_index + 1} · ` +
        (labels.length ? labels.join(", ") : "no detections"),
    );
  }

  loaded() {
    return this.img.complete && this.img.naturalWidth > 0;
  }

  showImage(url, name) {
    if (url !== this.url) {
      if (!this.loaded()) this.release(); // a loaded one stays on screen until the next is
      this.url = url;
      this.img.src = url;
    }
    // The button's name is its content, the picture's alt and its boxes' labels, so that
    // the name holds every word the button shows (WCAG 2.5.3, axe's label-content-name-mismatch).
    this.name = name;
    this.img.alt = `${name}, show full size:`;
    this.frame.disabled = false;
    if (this.frame.firstChild !== this.img) this.frame.replaceChildren(this.img, this.layer);
  }

  unavailable(why) {
    this.release();
    setText(this.placeholder, why);
    this.frame.removeAttribute("aria-label");
    this.frame.disabled = true;
    if (this.frame.firstChild !== this.placeholder) this.frame.replaceChildren(this.placeholder);
  }

  /** Leaves the page: nothing more is loaded for it. */
  drop() {
    if (!this.loaded()) this.release();
    forgetBoxes(this.layer);
    this.node.remove();
  }
}

function definition(term, value) {
  return [h("dt", { text: term }), h("dd", {}, value)];
}

function sha(value) {
  return h("code", { class: "sha", text: value });
}

async function provenance(runId, mode) {
  const answer = await api("GET", `${runPath(runId)}/snapshot`);
  const s = answer.snapshot;
  // Saved items whose recording was replaced or deleted since (output_current false).
  const stale = new Map();
  if (mode === "full") {
    const review = await api("GET", `${runPath(runId)}/review`, { query: { page_size: "1000" } });
    for (const { item } of review.items) {
      if (!item.output_current) stale.set(item.recording_id, (stale.get(item.recording_id) || 0) + 1);
    }
  }
  const models = s.models.length === 0
    ? h("p", { class: "muted", text: "No model." })
    : h("ul", {}, s.models.map((m) => h(
      "li", {}, `${m.name} v${m.version}${m.resolved_from_latest ? " (latest)" : ""}, weights SHA-256 `,
      sha(m.weights_sha256),
    )));
  const recordings = h("ul", { id: "recordings" }, answer.recordings.map((r) => {
    const count = stale.get(r.recording_id) || 0;
    return h(
      "li", { "data-recording-id": r.recording_id },
      `${r.recording_id} (${r.camera_id}), generation ${r.generation}, SHA-256 `, sha(r.sha256),
      count ? h("span", {
        class: "stale", text: ` stale: ${count} saved item${count === 1 ? "" : "s"} from an older generation`,
      }) : null,
    );
  }));
  const more = answer.next_page_token
    ? h("p", { class: "muted", text: `First ${answer.recordings.length} of ${s.recording_count} recordings.` })
    : null;
  return [
    h("h2", { id: "provenance-title", text: "Provenance" }),
    h("dl", { class: "facts" },
      definition("Workflow", `${s.workflow_id || "photo"}, revision ${s.workflow_revision}`),
      definition("Runtime", s.runtime_id),
      definition("Code SHA-256", sha(s.code_sha256)),
      definition("Policy revision", String(s.policy_revision)),
      definition("Recordings SHA-256", sha(s.recordings_sha256))),
    h("h3", { text: "Pinned models" }), models,
    h("h3", { text: `Recordings (${s.recording_count})` }), recordings, more,
  ];
}

const OUTCOME_WORDS = {
  running: "running",
  completed: "completed",
  failed: "failed",
  lapsed: "lapsed",
  handed_back: "handed back",
  cancelled: "cancelled",
  expired: "expired",
};

/** One attempt in words: who claimed it, where and when, how it ended, what the fences
 * refused under it. */
export function attemptText(attempt) {
  const where = attempt.device_id || attempt.runtime_id;
  let text = `Attempt ${attempt.generation}: claimed by key ${attempt.claimed_by || "?"} on ${where} ` +
    `at ${utc(attempt.claimed_at)}; `;
  const outcome = attempt.outcome;
  if (outcome === "running") text += `running, lease until ${utc(attempt.lease_until)}`;
  else if (outcome === "lapsed") {
    const missed = attempt.heartbeats_missed;
    text += `lease lapsed at ${utc(attempt.lease_until)} (${missed} heartbeat${missed === 1 ? "" : "s"} missed), ` +
      `taken back at ${utc(attempt.ended_at)}`;
  } else text += `${OUTCOME_WORDS[outcome] || outcome} at ${utc(attempt.ended_at)}`;
  if (attempt.failure_reason) text += ` (${attempt.failure_reason.replaceAll("_", " ")})`;
  if (attempt.refusals.length) {
    text += `; fences refused ${attempt.refusals.map((r) => `${r.reason} ×${r.count}`).join(", ")}`;
  }
  return `${text}.`;
}

/** The timeline panel's content: each job that was claimed, with its attempts in order. */
async function timeline(runId) {
  const answer = await api("GET", `${runPath(runId)}/timeline`, { query: { page_size: String(JOB_LIMIT) } });
  const claimedJobs = answer.jobs.filter((job) => job.attempts.length > 0);
  const unclaimed = answer.jobs.length - claimedJobs.length;
  return [
    h("h2", { id: "timeline-title", text: "Timeline" }),
    claimedJobs.length === 0 ? h("p", { class: "muted", text: "No job has been claimed yet." })
      : h("ol", { id: "timeline-jobs", class: "timeline" }, claimedJobs.map((job) => h(
        "li", { "data-job-id": job.job_id },
        h("strong", { text: `${job.job_id}` }), ` (${job.camera_id}, ${job.recording_id}): ${job.state}`,
        job.lapses ? `, ${job.lapses} lapse${job.lapses === 1 ? "" : "s"}` : "",
        h("ol", { class: "attempts" }, job.attempts.map((attempt) => h(
          "li", { "data-generation": String(attempt.generation), "data-outcome": attempt.outcome,
            text: attemptText(attempt) }))),
      ))),
    unclaimed ? h("p", { class: "muted", text: `${unclaimed} job${unclaimed === 1 ? "" : "s"} not claimed yet.` }) : null,
    answer.next_page_token ? h("p", { class: "muted", text: `The first ${answer.jobs.length} jobs.` }) : null,
  ];
}

export async function runView({ main, account, id, alive }) {
  const runId = id;
  // The session (which also holds the CSRF token Cancel needs) and the run at once; the
  // provenance panel follows when its reads answer, after the page painted.
  const [session, first] = await Promise.all([
    currentSession(),
    api("GET", runPath(runId), { query: { job_limit: String(JOB_LIMIT) } }),
  ]);
  if (!alive()) return;
  accountBar(account, session);

  const heading = h("h1", { tabindex: "-1", text: `Run ${runId}` });
  const status = h("span", { id: "run-status", class: "status" });
  const facts = h("p", { id: "run-facts" });
  const counts = h("p", { id: "run-counts", class: "number" });
  const expiry = h("p", { id: "run-expiry" });
  const liveNote = h("p", { id: "live-note", role: "status", class: "muted" });
  const waiting = h("section", { id: "waiting", class: "panel", "aria-labelledby": "waiting-title", hidden: true },
    h("h2", { id: "waiting-title", text: "Waiting behind" }),
    h("p", { text: "Queued behind older runs on the same runtime, oldest first:" }),
    h("ul", { id: "waiting-runs" }));
  const cancelNote = h("p", { id: "cancel-note", role: "status" });
  const cancelError = h("p", { class: "error", role: "alert", hidden: true });
  const cancel = h("button", { type: "button", id: "cancel", class: "danger", text: "Cancel run" });
  const retry = h("button", { type: "button", id: "live-retry", class: "secondary", text: "Try live updates again", hidden: true });
  const review = h("a", { id: "review-link", href: `#/review/${encodeURIComponent(runId)}`, text: "Review what it saved" });
  const jobList = h("ol", { id: "jobs", class: "jobs" });
  const jobsNote = h("p", { class: "muted" });
  const gallery = h("div", { id: "images", class: "images" });
  const imagesNote = h("p", { id: "images-note", class: "muted" });
  const fullSize = new FullSize();
  const snapshotPanel = h("section", { id: "provenance", class: "panel", "aria-labelledby": "provenance-title" },
    h("h2", { id: "provenance-title", text: "Provenance" }), h("p", { class: "muted", text: "Loading…" }));
  const timelinePanel = h("section", { id: "timeline", class: "panel", "aria-labelledby": "timeline-title" },
    h("h2", { id: "timeline-title", text: "Timeline" }), h("p", { class: "muted", text: "Loading…" }));
  let timelineKey = null;
  let timelineAt = 0;
  let timelineTimer = null;

  const jobViews = new Map();
  const imageViews = new Map();
  let detail = first.detail;
  let painted = null;
  let frameRequested = false;
  let socket = null;
  let pollTimer = null;
  let waitingKey = "";
  let waitingAt = 0;
  let stopped = false;
  let ticker = null;

  function paint() {
    frameRequested = false;
    if (detail === painted) return;
    painted = detail;
    const run = detail.run;
    setText(status, run.status);
    status.className = `status status-${run.status}`;
    setText(facts, `${run.mode} run of ${run.workflow_id || "a photo"} (revision ${run.workflow_revision}) ` +
      `on runtime ${run.runtime_id}, created ${age(run.created_at)} by ${creator(run.created_by)}` +
      (run.finished_at ? `, finished ${utc(run.finished_at)}` : ""));
    const c = run.counts;
    const committed = c.slots_frame + c.slots_empty + c.slots_dropped;
    setText(counts, `Jobs: ${c.jobs_completed} of ${c.jobs_total} done` +
      `${c.jobs_leased ? `, ${c.jobs_leased} running` : ""}${c.jobs_queued ? `, ${c.jobs_queued} queued` : ""}` +
      `${c.jobs_failed ? `, ${c.jobs_failed} failed` : ""}${c.jobs_cancelled ? `, ${c.jobs_cancelled} cancelled` : ""}` +
      `${c.jobs_expired ? `, ${c.jobs_expired} expired` : ""}. ` +
      `Slots: ${committed} of ${c.slots_expected} (${percent(committed, c.slots_expected)}%): ` +
      `${c.slots_frame} frames, ${c.slots_empty} empty, ${c.slots_dropped} dropped. ` +
      `Previews published: ${c.previews_published}` + (run.mode === "full" ? `; items saved: ${c.items_saved}.` : "."));
    cancel.hidden = FINAL.has(run.status);
    review.hidden = run.mode !== "full";
    paintWaiting(run);
    paintJobs();
    paintImages();
    paintTimeline();
    tick();
  }

  /** Reads the timeline again when a job changed state or lease (a claim, a lapse, an end),
   * at most once per TIMELINE_REFRESH_MS. */
  function paintTimeline() {
    const key = detail.jobs.map((job) => `${job.job_id}:${job.state}:${job.generation}`).join(" ");
    if (key === timelineKey || timelineTimer !== null) return;
    const wait = Math.max(0, timelineAt + TIMELINE_REFRESH_MS - Date.now());
    timelineTimer = setTimeout(() => {
      timelineTimer = null;
      if (stopped) return;
      timelineKey = key;
      timelineAt = Date.now();
      timeline(runId).then(
        (parts) => { if (!stopped) show(timelinePanel, parts); },
        (error) => {
          if (stopped) return;
          if (error instanceof ApiError && error.status === 401) { stop(); sessionEnded(); return; }
          show(timelinePanel, h("h2", { id: "timeline-title", text: "Timeline" }),
            h("p", { class: "error", role: "alert", text: `The timeline could not be read: ${error.message}` }));
        },
      );
    }, wait);
  }

  function schedule() {
    if (frameRequested) return;
    frameRequested = true;
    requestAnimationFrame(paint);
  }

  function receive(next) {
    detail = next;
    schedule();
  }

  function paintJobs() {
    const frames = new Map();
    for (const image of detail.recent_images) {
      if (!frames.has(image.job_id)) frames.set(image.job_id, new Set());
      frames.get(image.job_id).add(image.slot_index);
    }
    const counts = detail.run.counts;
    const allShown = detail.recent_images.length >= counts.slots_frame;
    const seen = new Set();
    detail.jobs.forEach((job, index) => {
      seen.add(job.job_id);
      let view = jobViews.get(job.job_id);
      if (!view) jobViews.set(job.job_id, (view = new JobView(job)));
      view.update(job, slotStates(job, frames.get(job.job_id) || new Set(), counts, allShown));
      if (jobList.children[index] !== view.node) jobList.insertBefore(view.node, jobList.children[index] || null);
    });
    for (const [jobId, view] of jobViews) {
      if (!seen.has(jobId)) { view.node.remove(); jobViews.delete(jobId); }
    }
    setText(jobsNote, detail.jobs_truncated
      ? `Showing the first ${detail.jobs.length} of ${detail.run.counts.jobs_total} jobs.` : "");
  }

  /** What previewExpired needs to know about the current detail, now. */
  function expiryFacts() {
    return {
      fullRun: detail.run.mode === "full",
      jobStates: new Map(detail.jobs.map((job) => [job.job_id, job.state])),
      now: Date.now(),
    };
  }

  function paintImages() {
    const images = byFrameTime(detail.recent_images);
    const wanted = new Set(images.map((image) => image.item_id));
    // Previews that left the detail (a full run's, when their job committed), by frame:
    // the frame's saved item takes the node over, so the page shows it in their place
    // and a preview load still under way is cancelled rather than answered 404.
    const leaving = new Map();
    for (const [itemId, view] of imageViews) {
      if (!wanted.has(itemId) && view.image.source === "preview") leaving.set(frameKey(view.image), itemId);
    }
    const now = expiryFacts();
    images.forEach((image, index) => {
      let view = imageViews.get(image.item_id);
      if (!view) {
        const previous = image.source === "item" ? leaving.get(frameKey(image)) : undefined;
        if (previous !== undefined) {
          view = imageViews.get(previous);
          imageViews.delete(previous);
          leaving.delete(frameKey(image));
        } else view = new ImageView(runId, openFullSize);
        imageViews.set(image.item_id, view);
      }
      view.update(image, previewExpired(image, now));
      if (gallery.children[index] !== view.node) gallery.insertBefore(view.node, gallery.children[index] || null);
    });
    for (const [itemId, view] of imageViews) {
      if (!wanted.has(itemId)) { view.drop(); imageViews.delete(itemId); }
    }
    const run = detail.run;
    setText(imagesNote, images.length
      ? `The ${images.length} newest images, by frame time, latest first.`
      : run.mode !== "full" && run.status === "expired" ? "The run's hour is over: its images expired."
        : "No images yet.");
  }

  /** Previews whose expiry passed while the page was open: not asked for any more. */
  function expireImages() {
    const now = expiryFacts();
    for (const view of imageViews.values()) {
      if (previewExpired(view.image, now)) view.update(view.image, true);
    }
  }

  function openFullSize(view) {
    const image = view.image;
    fullSize.open({
      src: view.url,
      alt: view.name,
      title: `${image.camera_id} · ${utc(image.frame_time)} · slot ${image.slot_index + 1}`,
      boxes: image.boxes,
      opener: view.frame,
    });
  }

  function paintWaiting(run) {
    const ids = run.status === "queued" ? run.waiting_behind : [];
    waiting.hidden = ids.length === 0;
    const key = ids.join(" ");
    if (!ids.length || (key === waitingKey && Date.now() - waitingAt < WAITING_REFRESH_MS)) return;
    waitingKey = key;
    waitingAt = Date.now();
    Promise.all(ids.map((other) => api("GET", runPath(other), { query: { job_limit: "1" } })
      .then((answer) => answer.detail.run, () => null)))
      .then((runs) => {
        if (stopped || key !== waitingKey) return;
        show(waiting.querySelector("#waiting-runs"), ids.map((other, i) => {
          const r = runs[i];
          const link = h("a", { href: `#/run/${encodeURIComponent(other)}`, text: other });
          if (!r) return h("li", { "data-run-id": other }, link, " (not visible to you)");
          const c = r.counts;
          const committed = c.slots_frame + c.slots_empty + c.slots_dropped;
          return h("li", { "data-run-id": other }, link,
            ` ${r.status}: jobs ${c.jobs_completed} of ${c.jobs_total} done, ` +
            `slots ${committed} of ${c.slots_expected} (${percent(committed, c.slots_expected)}%)`);
        }));
      });
  }

  function tick() {
    if (!alive()) return stop();
    const run = detail.run;
    if (run.expires_at && run.mode !== "full") {
      const left = countdown(run.expires_at);
      setText(expiry, left ? `Test run: results expire in ${left} (${utc(run.expires_at)}).`
        : `Test run: results expired at ${utc(run.expires_at)}.`);
    } else setText(expiry, run.mode === "full" ? "Full run: results are saved into its buckets." : "");
    if (run.status === "queued" && run.waiting_behind.length) paintWaiting(run);
    expireImages();
    return undefined;
  }

  function stop() {
    if (stopped) return;
    stopped = true;
    clearInterval(ticker);
    clearTimeout(pollTimer);
    clearTimeout(timelineTimer);
    if (socket) socket.close(1000, "page left");
    for (const view of imageViews.values()) forgetBoxes(view.layer);
    forgetBoxes(fullSize.layer);
  }

  async function poll() {
    if (stopped) return;
    if (!alive()) return stop();
    try {
      const answer = await api("GET", runPath(runId), { query: { job_limit: String(JOB_LIMIT) } });
      if (stopped || liveNote.dataset.mode !== "polling") return undefined; // live again
      receive(answer.detail);
      if (FINAL.has(answer.detail.run.status)) {
        setText(liveNote, `The run is ${answer.detail.run.status}; nothing more will change.`);
        liveNote.dataset.mode = "final";
        retry.hidden = true;
        return undefined;
      }
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) { stop(); sessionEnded(); return undefined; }
      if (stopped || liveNote.dataset.mode !== "polling") return undefined;
      setText(liveNote, `Live updates stopped; the last check failed (${error.message}). ` +
        `Trying again every ${POLL_SECONDS} seconds.`);
    }
    pollTimer = setTimeout(poll, POLL_SECONDS * 1000);
    return undefined;
  }

  function fallBack(why) {
    socket = null;
    if (stopped || FINAL.has(detail.run.status)) return;
    setText(liveNote, `Live updates stopped (${why}); checking the run every ${POLL_SECONDS} seconds instead.`);
    liveNote.dataset.mode = "polling";
    retry.hidden = false;
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, POLL_SECONDS * 1000);
  }

  retry.addEventListener("click", () => {
    clearTimeout(pollTimer);
    retry.hidden = true;
    liveNote.dataset.mode = "connecting";
    setText(liveNote, "Connecting to live updates…");
    connect();
  });

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${window.location.host}${runPath(runId)}/live`);
    socket = ws;
    let final = false;
    ws.addEventListener("open", () => {
      setText(liveNote, "Live: updates arrive as the run progresses.");
      liveNote.dataset.mode = "live";
    });
    ws.addEventListener("message", (event) => {
      if (stopped) return;
      const message = JSON.parse(event.data);
      final = final || message.final;
      // How many live messages this page took (the tests read it; a person never needs it).
      liveNote.dataset.messages = String(Number(liveNote.dataset.messages || 0) + 1);
      receive(message.detail);
    });
    ws.addEventListener("close", (event) => {
      if (stopped || socket !== ws) return;
      if (final || event.code === 1000) {
        socket = null;
        liveNote.dataset.mode = "final";
        setText(liveNote, `The run is ${detail.run.status}; nothing more will change.`);
        return;
      }
      fallBack(event.reason || `the connection closed, code ${event.code}`);
    });
  }

  cancel.addEventListener("click", async () => {
    if (!window.confirm(`Cancel run ${runId}? Its queued and running jobs stop; completed jobs keep their results.`)) return;
    cancel.disabled = true;
    cancelError.hidden = true;
    try {
      const answer = await api("POST", `${runPath(runId)}/cancel`);
      setText(cancelNote, `Run ${runId} is ${answer.run.status}: ${answer.jobs_cancelled} ` +
        `job${answer.jobs_cancelled === 1 ? "" : "s"} cancelled.`);
      receive({ ...detail, run: answer.run });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) { stop(); sessionEnded(); return; }
      cancelError.textContent = `Cancelling failed: ${error.message}`;
      cancelError.hidden = false;
    } finally {
      cancel.disabled = false;
    }
  });

  show(
    main,
    h("p", {}, h("a", { href: "#/runs", text: "← All runs" })),
    heading,
    h("section", { class: "panel run-head", "aria-labelledby": "status-title" },
      h("h2", { id: "status-title", class: "visually-hidden", text: "Status" }),
      h("p", {}, "Status: ", status), facts, counts, expiry, liveNote,
      h("div", { class: "actions" }, cancel, retry, review), cancelNote, cancelError),
    waiting,
    h("section", { "aria-labelledby": "jobs-title" },
      h("h2", { id: "jobs-title", text: "Jobs" }),
      h("p", { class: "legend" }, ["frame", "empty", "dropped", "unseen", "pending"].map((state) =>
        h("span", {}, h("span", { class: `slot slot-${state}` }), ` ${SLOT_WORDS[state]}`))),
      jobList, jobsNote),
    h("section", { "aria-labelledby": "images-title" },
      h("h2", { id: "images-title", text: "Recent images" }), imagesNote, gallery),
    timelinePanel,
    snapshotPanel,
    fullSize.node,
  );
  document.title = `Run ${runId} · Workshop`;
  paint();
  heading.focus();
  // When the first detail was on the page (bench and tests read it; see docs/console.md).
  performance.mark("workshop:run-painted");
  provenance(runId, first.detail.run.mode).then(
    (parts) => { if (!stopped) show(snapshotPanel, parts); },
    (error) => {
      if (stopped) return;
      if (error instanceof ApiError && error.status === 401) { stop(); sessionEnded(); return; }
      show(snapshotPanel, h("h2", { id: "provenance-title", text: "Provenance" }),
        h("p", { class: "error", role: "alert", text: `The snapshot could not be read: ${error.message}` }));
    },
  );
  ticker = setInterval(tick, 1000);
  if (FINAL.has(detail.run.status)) {
    liveNote.dataset.mode = "final";
    setText(liveNote, `The run is ${detail.run.status}; nothing more will change.`);
  } else connect();
}

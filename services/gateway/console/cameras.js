// The cameras page (#/cameras, #/cameras/<camera_id>?day=YYYY-MM-DD): each registered
// camera (the catalog), and for the chosen one its current recordings
// (GET /api/workshop/recordings: recordings live 40 days, so one read holds them all)
// grouped by UTC day: the days with footage, and for the chosen day a timeline of what is
// covered with the gaps visible, also written out. A still of any moment of the day is a
// photo (POST /api/workshop/photos, then GET .../photos/{id} until it is taken by a
// processor), shown from the run's preview image route. Registering cameras and
// importing recordings are an operator's (the `workshop` CLI).
import { ApiError, api, currentSession } from "./api.js";
import { h, show, svg } from "./dom.js";
import { go, sessionEnded } from "./nav.js";
import { accountBar } from "./runs.js";

const DAY_MS = 24 * 3600 * 1000;
const FINAL = ["completed", "failed", "cancelled", "expired"];

const dayOf = (timestamp) => new Date(timestamp).toISOString().slice(0, 10);
const clockOf = (ms) => new Date(ms).toISOString().slice(11, 19);

/** Covered spans of `day` (UTC) from the recordings, merged where they touch or overlap:
 * [{from, to, ids}] in ms since the epoch, and the gaps between them. */
export function coverage(recordings, day) {
  const start = Date.parse(`${day}T00:00:00Z`);
  const end = start + DAY_MS;
  const spans = recordings
    .map((r) => ({ from: Math.max(start, Date.parse(r.start)), to: Math.min(end, Date.parse(r.end)), ids: [r.recording_id] }))
    .filter((s) => s.to > s.from)
    .sort((a, b) => a.from - b.from);
  const merged = [];
  for (const span of spans) {
    const last = merged[merged.length - 1];
    if (last && span.from <= last.to) {
      last.to = Math.max(last.to, span.to);
      last.ids.push(...span.ids);
    } else merged.push({ ...span, ids: [...span.ids] });
  }
  const gaps = [];
  let at = start;
  for (const span of merged) {
    if (span.from > at) gaps.push({ from: at, to: span.from });
    at = Math.max(at, span.to);
  }
  if (at < end) gaps.push({ from: at, to: end });
  return { start, covered: merged, gaps };
}

function span(s) {
  return `${clockOf(s.from)} to ${s.to % DAY_MS === 0 ? "24:00:00" : clockOf(s.to)}`;
}

function timeline(day, cover) {
  const minutes = (ms) => (ms - cover.start) / 60000;
  const title = `Coverage of ${day} (UTC): ${cover.covered.length ? cover.covered.map(span).join(", ") : "none"}`;
  return h("div", { class: "timeline-box" },
    svg("svg", { class: "timeline", viewBox: "0 0 1440 30", role: "img", "aria-labelledby": "timeline-title", preserveAspectRatio: "none" },
      svg("title", { id: "timeline-title", text: title }),
      svg("rect", { x: 0, y: 0, width: 1440, height: 30, class: "timeline-gap" }),
      cover.covered.map((s) => svg("rect", {
        x: minutes(s.from), y: 0, width: Math.max(1, minutes(s.to) - minutes(s.from)), height: 30, class: "timeline-covered",
      }, svg("title", { text: `${span(s)}: ${s.ids.join(", ")}` })))),
    h("div", { class: "timeline-hours", "aria-hidden": "true" },
      ["00:00", "06:00", "12:00", "18:00", "24:00"].map((text) => h("span", { text }))));
}

export async function camerasView({ main, account, id, params, alive }) {
  const session = await currentSession();
  const catalog = await api("GET", "/api/workshop/catalog");
  if (!alive()) return;
  const cameras = catalog.cameras;
  const cameraId = id || (cameras[0] ? cameras[0].camera_id : "");
  const answer = cameraId
    ? await api("GET", "/api/workshop/recordings", { query: { camera_id: cameraId, page_size: "1000" } })
    : { recordings: [] };
  if (!alive()) return;
  accountBar(account, session);
  const recordings = answer.recordings;
  const days = [...new Set(recordings.flatMap((r) => {
    const out = [];
    for (let t = Date.parse(`${dayOf(r.start)}T00:00:00Z`); t < Date.parse(r.end); t += DAY_MS) out.push(dayOf(t));
    return out;
  }))].sort();
  const wanted = /^\d{4}-\d\d-\d\d$/.test(params.get("day") || "") ? params.get("day") : days[days.length - 1] || new Date().toISOString().slice(0, 10);
  const here = (day) => `#/cameras/${encodeURIComponent(cameraId)}?day=${day}`;

  const picker = h("select", { id: "camera-pick" }, cameras.map((c) => h("option", {
    value: c.camera_id, selected: c.camera_id === cameraId, text: c.name && c.name !== c.camera_id ? `${c.name} (${c.camera_id})` : c.camera_id,
  })));
  const dayInput = h("input", { id: "camera-day", type: "date", value: wanted });
  const choose = h("form", {
    class: "filter", "aria-label": "Camera and day",
    onsubmit: (event) => {
      event.preventDefault();
      go(`#/cameras/${encodeURIComponent(picker.value)}?day=${dayInput.value || wanted}`);
    },
  }, h("div", { class: "field" }, h("label", { for: "camera-pick", text: "Camera" }), picker),
  h("div", { class: "field" }, h("label", { for: "camera-day", text: "Day (UTC)" }), dayInput),
  h("button", { type: "submit", text: "Show" }));

  const cover = coverage(recordings, wanted);
  const dayList = days.length
    ? h("p", { id: "camera-days" }, "Days with footage: ", days.flatMap((d, i) => [i ? ", " : "",
      d === wanted ? h("strong", { text: d, "aria-current": "date" }) : h("a", { href: here(d), text: d })]))
    : h("p", { id: "camera-days", class: "muted", text: "This camera has no current recordings." });
  const words = h("div", { id: "coverage" },
    h("p", { id: "coverage-covered" }, h("strong", { text: "Covered: " }),
      cover.covered.length ? cover.covered.map((s) => `${span(s)} (${s.ids.join(", ")})`).join("; ") : "nothing"),
    h("p", { id: "coverage-gaps" }, h("strong", { text: "Gaps: " }),
      cover.gaps.length ? cover.gaps.map(span).join("; ") : "none"));

  const content = cameraId ? [
    h("section", { "aria-labelledby": "coverage-title" },
      h("h2", { id: "coverage-title", text: `${cameraId} on ${wanted} (UTC)` }),
      dayList, timeline(wanted, cover), words),
    photoForm(cameraId, wanted, cover),
  ] : [h("p", { id: "cameras-empty", text: "No camera is registered yet." })];
  const heading = h("h1", { tabindex: "-1", text: "Cameras" });
  show(main, heading,
    h("p", { class: "muted", text: "What each camera's recordings cover, per day, and a still of any moment. " +
      "Registering cameras and importing recordings are an operator's task (the workshop CLI): read-only here." }),
    cameras.length ? choose : null, ...content);
  document.title = "Cameras · Workshop";
  heading.focus();
}

function photoForm(cameraId, day, cover) {
  const first = cover.covered[0];
  const time = h("input", { id: "photo-time", type: "time", step: "1", value: first ? clockOf(first.from + 1000) : "12:00:00" });
  const status = h("p", { id: "photo-status", role: "status" });
  const error = h("p", { id: "photo-error", class: "error", role: "alert", hidden: true });
  const figure = h("figure", { id: "photo", class: "photo", hidden: true });
  const submit = h("button", { type: "submit", text: "Take a photo" });
  let polling = 0;

  async function follow(photo, mine) {
    while (mine === polling) {
      if (photo.item_id) {
        const alt = `${cameraId} at ${photo.frame_time || photo.requested_time}`;
        figure.replaceChildren(
          h("img", { src: `/api/workshop/runs/${encodeURIComponent(photo.photo_id)}/previews/${encodeURIComponent(photo.item_id)}/image`, alt }),
          h("figcaption", { text: `${alt} (recording ${photo.recording_id}; kept for an hour)` }));
        figure.hidden = false;
        status.textContent = "The photo is ready.";
        return;
      }
      if (FINAL.includes(photo.status)) {
        status.textContent = `No photo: its run is ${photo.status}${photo.status === "completed" ? " (the recording has no frame there)" : ""}.`;
        return;
      }
      status.textContent = `Taking the photo (${photo.status}): a processor takes it before any workflow run's job.`;
      await new Promise((resolve) => { window.setTimeout(resolve, 1000); });
      if (mine !== polling || !document.body.contains(status)) return;
      photo = (await api("GET", `/api/workshop/photos/${encodeURIComponent(photo.photo_id)}`)).photo;
    }
  }

  const form = h("form", {
    id: "photo-form", class: "panel", "aria-labelledby": "photo-title",
    onsubmit: async (event) => {
      event.preventDefault();
      error.hidden = true;
      figure.hidden = true;
      const mine = ++polling;
      submit.disabled = true;
      try {
        const moment = `${day}T${time.value.length === 5 ? `${time.value}:00` : time.value}Z`;
        const answer = await api("POST", "/api/workshop/photos", { body: { camera_id: cameraId, time: moment } });
        await follow(answer.photo, mine);
      } catch (failure) {
        if (failure instanceof ApiError && failure.status === 401) {
          sessionEnded();
          return;
        }
        error.textContent = failure.message;
        error.hidden = false;
        status.textContent = "";
      } finally {
        submit.disabled = false;
      }
    },
  }, h("h2", { id: "photo-title", text: "A still of any moment" }),
  h("div", { class: "filter" },
    h("div", { class: "field" }, h("label", { for: "photo-time", text: `Time on ${day} (UTC)` }), time), submit),
  status, error, figure);
  return form;
}

// Dataset versions (docs/datasets.md, docs/console.md):
// - #/datasets: pick a bucket (the buckets of GET /api/workshop/summary);
// - #/datasets/<bucket id>: its versions (GET .../buckets/{id}/versions) and the form that
//   freezes a new one (POST, the answer saying whether it is new or the same content as an
//   existing version);
// - #/version/<version id>: one version's facts, its export as a download with progress,
//   and its diff against another version of the bucket (counts, then the changed items a
//   page at a time).
// The export is fetched with `Range: bytes=0-`, so the gateway answers 206 with the
// archive's size in Content-Length; the bytes are counted as they arrive, a broken
// stream is resumed from the byte it reached (`Range: bytes=N-`, `If-Range` its ETag),
// and the whole is saved through a Blob URL. A plain link to the same route is offered
// beside it (for archives too large to hold in the browser: the browser's own download,
// which `curl -C -` can resume too).
import { ApiError, Unreachable, api, currentSession } from "./api.js";
import { h, show } from "./dom.js";
import { accountBar, age } from "./runs.js";

const STATES = ["pending", "accepted", "rejected"];
const FORMATS = [["yolo", "YOLO (Ultralytics)"], ["coco", "COCO"]];
const DIFF_PAGE = 50;
const RESUMES = 5; // tries to go on after a broken download

const enc = encodeURIComponent;
const count = (n, word) => `${Number(n || 0).toLocaleString("en")} ${word}${Number(n) === 1 ? "" : "s"}`;

function when(timestamp) {
  if (!timestamp) return h("span", { class: "muted", text: "unknown" });
  return h("time", { datetime: timestamp, title: new Date(timestamp).toUTCString(), text: age(timestamp) });
}

function who(principal) {
  if (!principal) return "unknown";
  return principal.display_name || principal.user_id || principal.key_id || "unknown";
}

export function megabytes(bytes) {
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

function shortId(id) {
  return h("code", { class: "version-id", title: id, text: `${id.slice(0, 15)}…` });
}

function splitText(version) {
  return `${version.train_count || 0} train / ${version.val_count || 0} val ` +
    `(seed ${version.seed || 0}, val ${version.val_fraction || 0})`;
}

function filterText(filter) {
  if (!filter) return "accepted items";
  const parts = [`review: ${(filter.review_states || []).join(", ") || "accepted"}`];
  if (filter.class_name) parts.push(`class ${filter.class_name}`);
  if (filter.camera_id) parts.push(`camera ${filter.camera_id}`);
  if (filter.frame_time_from) parts.push(`from ${filter.frame_time_from}`);
  if (filter.frame_time_to) parts.push(`before ${filter.frame_time_to}`);
  return parts.join("; ");
}

function problem(error) {
  if (error instanceof ApiError || error instanceof Unreachable) {
    const field = error.details && error.details.field;
    return field ? `${error.message} (field ${field})` : error.message;
  }
  return `Something went wrong: ${error}`;
}

// --- #/datasets: the bucket picker --------------------------------------------------------

async function pickerView({ main }) {
  const summary = await api("GET", "/api/workshop/summary", { query: { time_zone: "UTC", days: 1 } });
  const buckets = summary.buckets || [];
  const heading = h("h1", { tabindex: "-1", text: "Datasets" });
  const select = h("select", { id: "bucket-picker", name: "bucket" },
    buckets.map((b) => h("option", { value: b.bucket_id, text: b.bucket_id })));
  const form = h("form", { class: "filter", id: "bucket-form" },
    h("div", { class: "field" }, h("label", { for: "bucket-picker", text: "Bucket" }), select),
    h("button", { type: "submit", text: "Show its versions" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    window.location.hash = `#/datasets/${enc(select.value)}`;
  });
  show(
    main, heading,
    h("p", { class: "muted", text: "A dataset version is a bucket's items frozen with their reviewed boxes and a seeded train/val split: its export is the same bytes whenever it is made." }),
    buckets.length ? form : h("p", { id: "buckets-empty", text: "No buckets yet: a full run saves images into one." }),
    buckets.length ? h("ul", { class: "bucket-links" }, buckets.map((b) => h("li", {},
      h("a", { href: `#/datasets/${enc(b.bucket_id)}`, text: b.bucket_id }),
      ` ${count(b.images, "image")}, ${b.accepted} accepted`))) : null,
  );
  document.title = "Datasets · Workshop";
  heading.focus();
}

// --- #/datasets/<bucket>: versions and the freeze form -------------------------------------

function versionsTable(versions) {
  if (versions.length === 0) return h("p", { id: "versions-empty", text: "No versions of this bucket yet." });
  const columns = ["Name", "Id", "Items", "Classes", "Split", "Created"];
  return h("div", { class: "table-wrap" }, h(
    "table", { id: "versions", class: "stacking" },
    h("caption", { text: "Versions, newest first" }),
    h("thead", {}, h("tr", {}, columns.map((title) => h("th", { scope: "col", text: title })))),
    h("tbody", {}, versions.map((v) => h(
      "tr", { "data-version-id": v.version_id },
      h("th", { scope: "row", "data-label": "Name" },
        h("a", { href: `#/version/${enc(v.version_id)}`, text: v.name })),
      h("td", { "data-label": "Id" }, shortId(v.version_id)),
      h("td", { class: "number items", "data-label": "Items", text: String(v.item_count || 0) }),
      h("td", { class: "version-classes", "data-label": "Classes", text: (v.classes || []).join(", ") || "none" }),
      h("td", { "data-label": "Split", text: splitText(v) }),
      h("td", { "data-label": "Created" }, `${who(v.created_by)}, `, when(v.created_at)),
    ))),
  ));
}

function field(id, label, input, hint) {
  return h("div", { class: "field" }, h("label", { for: id, text: label }), input,
    hint ? h("span", { class: "hint muted", id: `${id}-hint`, text: hint }) : null);
}

function utc(value) {
  // <input type="datetime-local"> is local time without a zone: as an instant, in UTC.
  return value ? new Date(value).toISOString() : undefined;
}

function freezeForm(bucketId, onFrozen) {
  const name = h("input", { id: "freeze-name", name: "name", required: true, maxlength: 200, autocomplete: "off" });
  const states = STATES.map((state) => h("label", { class: "check" },
    h("input", { type: "checkbox", name: "review_states", value: state, checked: state === "accepted" }), ` ${state}`));
  const className = h("input", { id: "freeze-class", name: "class_name", autocomplete: "off" });
  const camera = h("input", { id: "freeze-camera", name: "camera_id", autocomplete: "off" });
  const from = h("input", { id: "freeze-from", name: "frame_time_from", type: "datetime-local", step: 1 });
  const to = h("input", { id: "freeze-to", name: "frame_time_to", type: "datetime-local", step: 1 });
  const seed = h("input", { id: "freeze-seed", name: "seed", type: "number", min: 0, step: 1, value: 0, inputmode: "numeric" });
  const fraction = h("input", { id: "freeze-fraction", name: "val_fraction", type: "number", min: 0, max: 0.99, step: 0.01, value: 0.2 });
  const button = h("button", { type: "submit", text: "Freeze version" });
  const status = h("p", { id: "freeze-status", role: "status" });
  const form = h(
    "form", { id: "freeze-form", class: "freeze", "aria-labelledby": "freeze-title" },
    h("h2", { id: "freeze-title", text: "Freeze a new version" }),
    field("freeze-name", "Name", name),
    h("fieldset", { class: "states" }, h("legend", { text: "Review states (none ticked: accepted only)" }), states),
    h("div", { class: "filter" },
      field("freeze-class", "Class", className, "after relabels; empty: any"),
      field("freeze-camera", "Camera", camera, "empty: any"),
      field("freeze-from", "Frames from", from),
      field("freeze-to", "Frames before", to)),
    h("div", { class: "filter" },
      field("freeze-seed", "Split seed", seed),
      field("freeze-fraction", "Val fraction", fraction, "0 to under 1")),
    button, status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const filter = {
      review_states: states.map((l) => l.querySelector("input")).filter((i) => i.checked).map((i) => i.value),
    };
    if (className.value.trim()) filter.class_name = className.value.trim();
    if (camera.value.trim()) filter.camera_id = camera.value.trim();
    if (from.value) filter.frame_time_from = utc(from.value);
    if (to.value) filter.frame_time_to = utc(to.value);
    const body = {
      name: name.value, filter, seed: Number(seed.value || 0), val_fraction: Number(fraction.value || 0),
    };
    button.disabled = true;
    status.className = "";
    status.textContent = "Freezing…";
    try {
      const answer = await api("POST", `/api/workshop/buckets/${enc(bucketId)}/versions`, { body });
      const v = answer.version;
      status.className = "notice";
      status.replaceChildren(
        answer.created ? "Froze a new version " : "The same content is frozen already as ",
        h("a", { href: `#/version/${enc(v.version_id)}`, text: `“${v.name}”` }),
        ` (${v.version_id.slice(0, 15)}…): ${count(v.item_count, "item")}` +
          (answer.created ? "." : "; nothing new was made."),
      );
      status.dataset.created = String(Boolean(answer.created));
      status.dataset.versionId = v.version_id;
      await onFrozen();
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) throw error;
      status.className = "error";
      status.textContent = problem(error);
    } finally {
      button.disabled = false;
    }
  });
  return form;
}

async function listVersions(bucketId) {
  const versions = [];
  let token = "";
  do {
    const page = await api("GET", `/api/workshop/buckets/${enc(bucketId)}/versions`, {
      query: { page_size: 1000, page_token: token },
    });
    versions.push(...(page.versions || []));
    token = page.next_page_token || "";
  } while (token && versions.length < 5000);
  return versions;
}

async function bucketView({ main, id: bucketId, alive }) {
  const versions = await listVersions(bucketId);
  if (!alive()) return;
  const heading = h("h1", { tabindex: "-1", text: `Datasets of bucket ${bucketId}` });
  const listing = h("section", { id: "versions-section", "aria-labelledby": "versions-title" },
    h("h2", { id: "versions-title", text: "Versions" }), versionsTable(versions));
  const refresh = async () => {
    const again = await listVersions(bucketId);
    show(listing, h("h2", { id: "versions-title", text: "Versions" }), versionsTable(again));
  };
  show(main, heading, h("p", {}, h("a", { href: "#/datasets", text: "All buckets" })),
    listing, freezeForm(bucketId, refresh));
  document.title = `Datasets of ${bucketId} · Workshop`;
  heading.focus();
}

// --- #/version/<id>: facts, export, diff ----------------------------------------------------

function facts(version) {
  const pairs = [
    ["Id", h("code", { class: "version-id-full", text: version.version_id })],
    ["Bucket", h("a", { href: `#/datasets/${enc(version.bucket_id)}`, text: version.bucket_id })],
    ["Items", h("span", { id: "version-items", text: String(version.item_count || 0) })],
    ["Boxes", String(version.box_count || 0)],
    ["Split", splitText(version)],
    ["Classes", h("span", { id: "version-classes", text: (version.classes || []).join(", ") || "none" })],
    ["Cameras", (version.camera_ids || []).join(", ") || "none"],
    ["Filter", filterText(version.filter)],
    ["Created", h("span", {}, `by ${who(version.created_by)}, `, when(version.created_at))],
  ];
  return h("dl", { class: "facts" }, pairs.flatMap(([term, value]) => [h("dt", { text: term }), h("dd", {}, value)]));
}

function fileName(response, fallback) {
  const match = /filename="([^"]+)"/.exec(response.headers.get("Content-Disposition") || "");
  return match ? match[1] : fallback;
}

/** The archive's bytes, counting them; resumes a broken stream from the byte it reached. */
export async function download(url, onProgress) {
  const chunks = [];
  let received = 0;
  let total = null;
  let etag = null;
  let name = "export.tar";
  for (let attempt = 0; ; attempt += 1) {
    const headers = { Range: `bytes=${received}-` };
    if (etag) headers["If-Range"] = etag;
    let response;
    try {
      response = await fetch(url, { headers, credentials: "same-origin", cache: "no-store" });
    } catch {
      if (attempt < RESUMES && received > 0) continue;
      throw new Unreachable();
    }
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch { body = null; }
      throw new ApiError(response.status, body, null);
    }
    if (response.status === 200 && received > 0) {
      chunks.length = 0; // the whole archive again (another ETag): start over
      received = 0;
    }
    etag = response.headers.get("ETag") || etag;
    name = fileName(response, name);
    const range = /\/(\d+)$/.exec(response.headers.get("Content-Range") || "");
    if (range) total = Number(range[1]);
    else if (response.headers.get("Content-Length")) total = received + Number(response.headers.get("Content-Length"));
    onProgress(received, total);
    const reader = response.body.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        chunks.push(value);
        received += value.byteLength;
        onProgress(received, total);
      }
    } catch (error) {
      if (attempt < RESUMES) continue; // broken mid-way: go on from `received`
      throw error;
    }
    if (total === null || received >= total) break;
    if (attempt >= RESUMES) throw new Error(`The download stopped at ${received} of ${total} bytes.`);
  }
  return { blob: new Blob(chunks, { type: "application/x-tar" }), name, received, total };
}

function exportSection(version) {
  const select = h("select", { id: "export-format", name: "format" },
    FORMATS.map(([value, label]) => h("option", { value, text: label })));
  const button = h("button", { type: "button", id: "export-button", text: "Download archive" });
  const progress = h("progress", { id: "export-progress", max: 1, value: 0, "aria-label": "Download progress", hidden: true });
  const status = h("p", { id: "export-status", role: "status" });
  const route = () => `/api/workshop/versions/${enc(version.version_id)}/export?format=${select.value}`;
  const link = h("a", { id: "export-link", href: route(), text: "plain link" });
  select.addEventListener("change", () => { link.href = route(); });
  button.addEventListener("click", async () => {
    button.disabled = true;
    progress.hidden = false;
    progress.removeAttribute("value");
    status.className = "";
    status.textContent = "Starting…";
    try {
      const got = await download(route(), (received, total) => {
        if (total) {
          progress.max = total;
          progress.value = received;
          status.textContent = `${megabytes(received)} of ${megabytes(total)} (${Math.floor((received / total) * 100)}%)`;
        } else {
          status.textContent = `${megabytes(received)}`;
        }
      });
      const href = URL.createObjectURL(got.blob);
      const save = h("a", { href, download: got.name, hidden: true });
      document.body.append(save);
      save.click();
      save.remove();
      setTimeout(() => URL.revokeObjectURL(href), 60_000);
      status.className = "notice";
      status.textContent = `Saved ${got.name}: ${got.received.toLocaleString("en")} bytes.`;
      status.dataset.bytes = String(got.received);
    } catch (error) {
      status.className = "error";
      status.textContent = problem(error);
    } finally {
      button.disabled = false;
    }
  });
  return h("section", { id: "export-section", "aria-labelledby": "export-title" },
    h("h2", { id: "export-title", text: "Export" }),
    h("div", { class: "filter" }, field("export-format", "Format", select), button),
    progress, status,
    h("p", { class: "muted" }, "The archive is held in this tab until it is complete, then saved. " +
      "For a very large one use the ", link, " instead: the browser downloads it itself " +
      "(and ", h("code", { text: "curl -C -" }), " resumes it)."));
}

function boxesText(boxes) {
  if (!boxes || boxes.length === 0) return "none";
  const classes = {};
  for (const box of boxes) classes[box.class_name] = (classes[box.class_name] || 0) + 1;
  return Object.entries(classes).map(([name, n]) => `${n} ${name}`).join(", ");
}

function kindText(kind) {
  return String(kind || "").toLowerCase().replace(/^dataset_change_kind_/, "").replace("_", " ");
}

function diffSection(version, others) {
  const section = h("section", { id: "diff-section", "aria-labelledby": "diff-title" },
    h("h2", { id: "diff-title", text: "Compare with another version" }));
  if (others.length === 0) {
    section.append(h("p", { class: "muted", text: "This bucket has no other version to compare with." }));
    return section;
  }
  const select = h("select", { id: "diff-from", name: "from" },
    others.map((v) => h("option", { value: v.version_id, text: `${v.name} (${v.version_id.slice(0, 15)}…)` })));
  const button = h("button", { type: "submit", text: "Compare" });
  const result = h("div", { id: "diff-result", "aria-live": "polite" });
  const form = h("form", { class: "filter", id: "diff-form" },
    field("diff-from", "Older version (the base)", select), button);
  let shown = [];
  const load = async (token) => {
    const answer = await api("GET", `/api/workshop/versions/${enc(version.version_id)}/diff`, {
      query: { from: select.value, page_size: DIFF_PAGE, page_token: token },
    });
    if (!token) {
      const c = answer.counts || {};
      shown = [];
      show(result,
        h("table", { id: "diff-counts" },
          h("caption", { text: `From ${select.selectedOptions[0].text} to this version` }),
          h("tbody", {}, [["Added", c.added], ["Removed", c.removed], ["Relabelled", c.relabelled],
            ["Boxes changed", c.boxes_changed], ["Unchanged", c.unchanged]].map(([label, n]) => h("tr", {
            "data-count": label.toLowerCase().replace(" ", "_"),
          }, h("th", { scope: "row", text: label }), h("td", { class: "number", text: String(n || 0) }))))),
        h("ul", { id: "diff-changes", class: "changes" }));
    }
    shown.push(...(answer.changes || []));
    const list = result.querySelector("#diff-changes");
    for (const change of answer.changes || []) {
      list.append(h("li", { "data-item-id": change.item_id, "data-kind": kindText(change.kind) },
        h("code", { text: change.item_id }), ` ${kindText(change.kind)}: `,
        `${boxesText(change.before)} → ${boxesText(change.after)}`));
    }
    result.querySelector("#diff-more")?.remove();
    if (answer.next_page_token) {
      const more = h("button", { type: "button", id: "diff-more", class: "secondary", text: `Show more (${shown.length} shown)` });
      more.addEventListener("click", () => load(answer.next_page_token).catch(fail));
      result.append(more);
    } else if (shown.length === 0) {
      list.append(h("li", { class: "muted", text: "No item changed." }));
    }
  };
  const fail = (error) => {
    if (error instanceof ApiError && error.status === 401) throw error;
    show(result, h("p", { class: "error", role: "alert", text: problem(error) }));
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load("").catch(fail);
  });
  section.append(form, result);
  return section;
}

async function versionView({ main, id: versionId, alive }) {
  const { version } = await api("GET", `/api/workshop/versions/${enc(versionId)}`);
  const others = (await listVersions(version.bucket_id)).filter((v) => v.version_id !== version.version_id);
  if (!alive()) return;
  const heading = h("h1", { tabindex: "-1", text: `Version “${version.name}”` });
  show(main, heading,
    h("p", {}, h("a", { href: `#/datasets/${enc(version.bucket_id)}`, text: `Versions of bucket ${version.bucket_id}` })),
    facts(version), exportSection(version), diffSection(version, others));
  document.title = `${version.name} · Datasets · Workshop`;
  heading.focus();
}

export async function datasetsView(context) {
  const session = await currentSession();
  accountBar(context.account, session);
  return context.id ? bucketView(context) : pickerView(context);
}

export async function versionPageView(context) {
  const session = await currentSession();
  accountBar(context.account, session);
  return versionView(context);
}

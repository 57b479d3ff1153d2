// The summary page (#/summary): GET /api/workshop/summary in the browser's time zone:
// per bucket its images and review counts, per workflow its runs, last run, classes and
// images saved per local day (a bar chart drawn as SVG, with a table as its text).
import { api, currentSession } from "./api.js";
import { h, scrollBox, show, svg } from "./dom.js";
import { accountBar, age } from "./runs.js";

const DAYS = 30;
const BAR = 16; // px per day
const CHART_HEIGHT = 100;
const TOP = 14; // room for the maximum's label
const BOTTOM = 16; // room for the first and last dates

/** The browser's IANA time zone (what GetSummary counts local days in); UTC if unknown. */
export function browserTimeZone() {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    return "UTC";
  }
}

const pad = (n) => String(n).padStart(2, "0");
export const isoDate = (date) => `${date.year}-${pad(date.month)}-${pad(date.day)}`;
const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

function when(timestamp) {
  if (!timestamp) return h("span", { class: "muted", text: "never" });
  return h("time", {
    datetime: timestamp, title: new Date(timestamp).toUTCString(), text: age(timestamp),
  });
}

function bucketsTable(buckets) {
  if (buckets.length === 0) return h("p", { id: "buckets-empty", text: "No buckets yet." });
  const columns = ["Bucket", "Images", "Accepted", "Rejected", "Pending", "Saved", "Last added"];
  return scrollBox("Buckets", h(
    "table", { id: "buckets" },
    h("caption", { text: "Per bucket: its items and their review (saved: still current)" }),
    h("thead", {}, h("tr", {}, columns.map((title) => h("th", { scope: "col", text: title })))),
    h("tbody", {}, buckets.map((bucket) => h(
      "tr", { "data-bucket-id": bucket.bucket_id },
      h("th", { scope: "row", text: bucket.name && bucket.name !== bucket.bucket_id
        ? `${bucket.name} (${bucket.bucket_id})` : bucket.bucket_id }),
      ...[bucket.images, bucket.accepted, bucket.rejected, bucket.pending, bucket.saved]
        .map((n) => h("td", { class: "number", text: String(n) })),
      h("td", {}, when(bucket.last_added_at)),
    ))),
  ));
}

/** Images saved per day as bars, named for assistive technology, with the same numbers
 * in a visually hidden table. */
export function dayChart(workflowId, days, timeZone) {
  const titleId = `chart-title-${workflowId}`;
  const max = Math.max(0, ...days.map((day) => day.images));
  const width = Math.max(days.length, 1) * BAR;
  const total = days.reduce((sum, day) => sum + day.images, 0);
  const first = days.length ? isoDate(days[0].date) : "";
  const last = days.length ? isoDate(days[days.length - 1].date) : "";
  const name = `Images saved per day, ${first} to ${last} (${timeZone}): ${total} in all, ` +
    `at most ${max} a day`;
  const base = TOP + CHART_HEIGHT;
  const chart = svg(
    "svg", {
      class: "chart", role: "img", "aria-labelledby": titleId,
      viewBox: `0 0 ${width} ${base + BOTTOM}`, width, height: base + BOTTOM,
      "data-workflow-id": workflowId,
    },
    svg("title", { id: titleId, text: name }),
    svg("line", { class: "chart-axis", x1: 0, y1: base + 0.5, x2: width, y2: base + 0.5 }),
    days.map((day, index) => {
      const height = max ? Math.round((day.images / max) * CHART_HEIGHT) : 0;
      return svg(
        "rect", {
          class: "chart-bar", x: index * BAR + 1, y: base - height, width: BAR - 2, height,
          "data-date": isoDate(day.date), "data-images": day.images,
        },
        svg("title", { text: `${isoDate(day.date)}: ${count(day.images, "image")}` }),
      );
    }),
    svg("text", { class: "chart-label", x: 0, y: TOP - 3, text: `max ${max}` }),
    svg("text", { class: "chart-label", x: 0, y: base + BOTTOM - 3, text: first }),
    svg("text", {
      class: "chart-label", x: width, y: base + BOTTOM - 3, "text-anchor": "end", text: last,
    }),
  );
  // (a wrapper hides it: a table's own box cannot be clipped)
  const table = h("div", { class: "visually-hidden" }, h(
    "table", {},
    h("caption", { text: name }),
    h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "Day" }), h("th", { scope: "col", text: "Images" }))),
    h("tbody", {}, days.map((day) => h(
      "tr", {}, h("th", { scope: "row", text: isoDate(day.date) }),
      h("td", { text: String(day.images) }),
    ))),
  ));
  return h(
    "figure", { class: "chart-figure" },
    h("figcaption", { text: `Images saved per day (${timeZone})` }), chart, table,
  );
}

function classesTable(workflow) {
  if (workflow.classes.length === 0) {
    return h("p", { class: "muted", text: "No detections saved by its full runs yet." });
  }
  return scrollBox(`Classes of ${workflow.name || workflow.workflow_id}`, h(
    "table", { class: "classes", "data-workflow-id": workflow.workflow_id },
    h("caption", { text: "Per class (after relabels): boxes in saved items, and of those in accepted items" }),
    h("thead", {}, h("tr", {}, ["Class", "Detections", "Confirmations"]
      .map((title) => h("th", { scope: "col", text: title })))),
    h("tbody", {}, workflow.classes.map((entry) => h(
      "tr", { "data-class": entry.class_name },
      h("th", { scope: "row", text: entry.class_name }),
      h("td", { class: "number", text: String(entry.detections) }),
      h("td", { class: "number", text: String(entry.confirmations) }),
    ))),
  ));
}

function lastRun(run) {
  if (!run) return h("span", { class: "muted", text: "never ran" });
  const parts = [
    run.mode === "full"
      ? h("a", { href: `#/review/${encodeURIComponent(run.run_id)}`, text: run.run_id })
      : run.run_id,
    " ",
    h("span", { class: `status status-${run.status}`, text: run.status }),
    ` ${run.mode}, `,
    when(run.created_at),
  ];
  return h("span", {}, parts);
}

function workflowSection(workflow, timeZone) {
  const titleId = `workflow-${workflow.workflow_id}`;
  const title = workflow.name && workflow.name !== workflow.workflow_id
    ? `${workflow.name} (${workflow.workflow_id})` : workflow.workflow_id;
  return h(
    "section", { class: "workflow-summary", "aria-labelledby": titleId, "data-workflow-id": workflow.workflow_id },
    h("h3", { id: titleId, text: `Workflow ${title}` }),
    h(
      "dl", { class: "facts" },
      h("dt", { text: "Runs" }), h("dd", { class: "runs-count", text: String(workflow.runs) }),
      h("dt", { text: "Last run" }), h("dd", {}, lastRun(workflow.last_run)),
    ),
    classesTable(workflow),
    dayChart(workflow.workflow_id, workflow.images_per_day, timeZone),
  );
}

export async function summaryView({ main, account, alive }) {
  const timeZone = browserTimeZone();
  const session = await currentSession();
  const summary = await api("GET", "/api/workshop/summary", { query: { time_zone: timeZone, days: DAYS } });
  if (!alive()) return;
  accountBar(account, session);
  const heading = h("h1", { tabindex: "-1", text: "Summary" });
  show(
    main,
    heading,
    h("p", { class: "muted", text: `Days are counted in your time zone, ${timeZone}, over the last ${DAYS} days.` }),
    h("h2", { text: "Buckets" }),
    bucketsTable(summary.buckets),
    h("h2", { text: "Workflows" }),
    summary.workflows.length
      ? summary.workflows.map((workflow) => workflowSection(workflow, timeZone))
      : h("p", { id: "workflows-empty", text: "No workflows yet." }),
  );
  document.title = "Summary · Workshop";
  heading.focus();
}

// The workflows page (#/workflows): every workflow (GET /api/workshop/workflows, most
// recently saved first) with its revision, when it was saved, its last run (from the
// summary, GET /api/workshop/summary) and its schedule; each name opens the editor, and
// New workflow opens an empty one.
import { api, currentSession } from "./api.js";
import { h, scrollBox, show } from "./dom.js";
import { accountBar, age } from "./runs.js";
import { clock } from "./workflow_graph.js";

function schedule(spec) {
  if (!spec.schedule) return h("span", { class: "muted", text: "none" });
  return `daily at ${clock(spec.schedule.time_of_day)} ${spec.time_zone || "UTC"}`;
}

function lastRun(summary) {
  if (!summary || !summary.last_run) return h("span", { class: "muted", text: "never run" });
  const run = summary.last_run;
  return h("span", {},
    h("a", { href: `#/run/${encodeURIComponent(run.run_id)}`, text: run.run_id }), " ",
    h("span", { class: `status status-${run.status}`, text: run.status }), ` ${run.mode}, `,
    h("time", { datetime: run.created_at, title: new Date(run.created_at).toUTCString(), text: age(run.created_at) }));
}

export async function workflowsView({ main, account, alive }) {
  const session = await currentSession();
  const [answer, summary] = await Promise.all([
    api("GET", "/api/workshop/workflows", { query: { page_size: "1000" } }),
    api("GET", "/api/workshop/summary", { query: { time_zone: "UTC", days: "1" } }),
  ]);
  if (!alive()) return;
  accountBar(account, session);
  const runs = new Map(summary.workflows.map((w) => [w.workflow_id, w]));
  const heading = h("h1", { tabindex: "-1", text: "Workflows" });
  const create = h("a", { class: "button", id: "new-workflow", href: "#/workflow", text: "New workflow" });
  const list = answer.workflows.length === 0
    ? h("p", { id: "workflows-empty", text: "No workflows yet: start one with New workflow." })
    : scrollBox("Workflows", h("table", { id: "workflows" },
      h("caption", { text: "Workflows, most recently saved first" }),
      h("thead", {}, h("tr", {}, ["Name", "Id", "Revision", "Saved", "Last run", "Schedule"]
        .map((title) => h("th", { scope: "col", text: title })))),
      h("tbody", {}, answer.workflows.map((w) => h("tr", { "data-workflow-id": w.workflow_id },
        h("th", { scope: "row" }, h("a", { href: `#/workflow/${encodeURIComponent(w.workflow_id)}`, text: w.spec.name || w.workflow_id })),
        h("td", { text: w.workflow_id }),
        h("td", { class: "number", text: String(w.revision) }),
        h("td", {}, h("time", { datetime: w.updated_at, title: new Date(w.updated_at).toUTCString(), text: age(w.updated_at) })),
        h("td", {}, lastRun(runs.get(w.workflow_id))),
        h("td", {}, schedule(w.spec)),
      )))));
  show(main, heading, h("p", {}, create), list);
  document.title = "Workflows · Workshop";
  heading.focus();
}

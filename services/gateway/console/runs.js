// The runs page: the newest runs (GET /api/workshop/runs, optionally of one workflow),
// each with its status, mode, job and slot counts, review counts (a link to the review
// page) and age, a link to each run's page, older pages by the list's page token, and the
// form to create a run. Filters: the workflow (a picker), status and mode, each applied by
// the API (ListRuns). The newest page refreshes itself every 5 s while the browser shows it.
import { api, currentSession, signOut } from "./api.js";
import { h, scrollBox, show } from "./dom.js";
import { go, sessionEnded } from "./nav.js";
import { runForm } from "./run_form.js";

/** "just now", "4 min ago", "3 h ago", "2 d ago" from an RFC 3339 time. */
export function age(timestamp, now = Date.now()) {
  const seconds = Math.max(0, Math.round((now - Date.parse(timestamp)) / 1000));
  if (seconds < 45) return "just now";
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min ago`;
  const hours = Math.round(minutes / 60);
  if (hours < 48) return `${hours} h ago`;
  return `${Math.round(hours / 24)} d ago`;
}

function jobs(counts) {
  const done = `${counts.jobs_completed} of ${counts.jobs_total} done`;
  const more = [
    ["queued", counts.jobs_queued],
    ["running", counts.jobs_leased],
    ["failed", counts.jobs_failed],
    ["cancelled", counts.jobs_cancelled],
    ["expired", counts.jobs_expired],
  ].filter(([, n]) => n > 0).map(([word, n]) => `${n} ${word}`);
  return more.length ? `${done} (${more.join(", ")})` : done;
}

function slots(counts) {
  const committed = counts.slots_frame + counts.slots_empty + counts.slots_dropped;
  return `${committed} of ${counts.slots_expected}: ${counts.slots_frame} frames, ` +
    `${counts.slots_empty} empty, ${counts.slots_dropped} dropped`;
}

function review(entry) {
  if (entry.run.mode !== "full") return h("span", { class: "muted", text: "test run: not saved" });
  const c = entry.review_counts;
  return h("a", {
    href: `#/review/${encodeURIComponent(entry.run.run_id)}`,
    text: `${c.pending} pending, ${c.accepted} accepted, ${c.rejected} rejected`,
  });
}

function row(entry) {
  const run = entry.run;
  const created = new Date(run.created_at);
  return h(
    "tr", { "data-run-id": run.run_id },
    h("th", { scope: "row" }, h("a", { href: `#/run/${encodeURIComponent(run.run_id)}`, text: run.run_id })),
    h("td", { text: run.workflow_id || "photo" }),
    h("td", {}, h("span", { class: `status status-${run.status}`, text: run.status })),
    h("td", { text: run.mode }),
    h("td", { class: "number", text: jobs(run.counts) }),
    h("td", { class: "number", text: slots(run.counts) }),
    h("td", {}, review(entry)),
    h("td", {}, h("time", {
      datetime: run.created_at, title: created.toUTCString(), text: age(run.created_at),
    })),
  );
}

export function accountBar(account, session) {
  const button = h("button", { type: "button", class: "secondary", text: "Sign out" });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await signOut();
      go("#/login?notice=signed-out");
    } catch (error) {
      if (error.status === 401) sessionEnded();
      else {
        button.disabled = false;
        window.alert(`Signing out failed: ${error.message}`);
      }
    }
  });
  const name = session.display_name || session.user_id;
  show(account, h("span", { text: `Signed in as ${name}` }), button);
}

export const STATUSES = ["queued", "running", "completed", "failed", "cancelled", "expired"];
export const MODES = ["test", "full"];
const REFRESH_MS = 5000;

function select(id, label, value, options) {
  const node = h("select", { id, name: id },
    options.map(([v, text]) => h("option", { value: v, text, selected: v === value })));
  return h("div", { class: "field" }, h("label", { for: id, text: label }), node);
}

function caption(filters) {
  const scope = filters.workflow ? `of workflow ${filters.workflow}` : "of every workflow";
  const narrowed = [filters.status && `status ${filters.status}`, filters.mode && `mode ${filters.mode}`].filter(Boolean);
  return `Recent runs ${scope}${narrowed.length ? ` (${narrowed.join(", ")})` : ""}, newest first`;
}

function emptyText(filters) {
  const of = filters.workflow ? ` of workflow ${filters.workflow}` : "";
  const kinds = [filters.status, filters.mode].filter(Boolean);
  if (kinds.length === 0) return of ? `No runs${of}.` : "No runs yet.";
  return `No ${kinds.join(" ")} runs${of}.`;
}

function runsTable(filters, answer) {
  const runs = answer.runs;
  if (runs.length === 0) return h("p", { id: "runs-empty", text: emptyText(filters) });
  return scrollBox("Runs", h(
    "table", { id: "runs" },
    h("caption", { text: caption(filters) }),
    h("thead", {}, h("tr", {}, ...["Run", "Workflow", "Status", "Mode", "Jobs", "Slots", "Review", "Age"]
      .map((title) => h("th", { scope: "col", text: title })))),
    h("tbody", {}, runs.map(row)),
  ));
}

export async function runsView({ main, account, params, alive }) {
  const filters = {
    workflow: (params.get("workflow") || "").trim(),
    status: STATUSES.includes(params.get("status")) ? params.get("status") : "",
    mode: MODES.includes(params.get("mode")) ? params.get("mode") : "",
  };
  const pageToken = params.get("page") || "";
  const session = await currentSession();
  const query = { workflow: filters.workflow, status: filters.status, mode: filters.mode, page_token: pageToken };
  const [answer, workflows, form] = await Promise.all([
    api("GET", "/api/workshop/runs", { query }),
    api("GET", "/api/workshop/workflows", { query: { page_size: "1000" } }),
    runForm().catch((error) => {
      if (error.status === 401) throw error;
      return h("p", { class: "error", role: "alert", text: `The form to create a run: ${error.message}` });
    }),
  ]);
  if (!alive()) return;
  accountBar(account, session);

  const known = workflows.workflows.map((w) => [w.workflow_id, `${w.spec.name || w.workflow_id} (${w.workflow_id})`]);
  if (filters.workflow && !known.some(([id]) => id === filters.workflow)) known.push([filters.workflow, filters.workflow]);
  const filter = h(
    "form", {
      class: "filter", role: "search", "aria-label": "Filter runs",
      onsubmit: (event) => {
        event.preventDefault();
        const chosen = {};
        for (const name of ["workflow", "status", "mode"]) {
          const value = document.getElementById(`filter-${name}`).value;
          if (value) chosen[name] = value;
        }
        const search = new URLSearchParams(chosen).toString();
        go(search ? `#/runs?${search}` : "#/runs");
      },
    },
    select("filter-workflow", "Workflow", filters.workflow, [["", "Every workflow"], ...known]),
    select("filter-status", "Status", filters.status, [["", "Any status"], ...STATUSES.map((v) => [v, v])]),
    select("filter-mode", "Mode", filters.mode, [["", "Test and full"], ...MODES.map((v) => [v, v])]),
    h("button", { type: "submit", text: "Filter" }),
    filters.workflow || filters.status || filters.mode
      ? h("button", { type: "button", class: "secondary", onclick: () => go("#/runs"), text: "Show all" })
      : null,
  );

  const list = h("div", { id: "runs-list" }, runsTable(filters, answer));
  const here = Object.fromEntries(Object.entries(filters).filter(([, v]) => v));
  const pages = h(
    "nav", { class: "pages", "aria-label": "Pages of runs" },
    pageToken ? h("a", { href: `#/runs?${new URLSearchParams(here)}`, text: "Newest runs" }) : null,
    answer.next_page_token
      ? h("a", {
        id: "older-runs", href: `#/runs?${new URLSearchParams({ ...here, page: answer.next_page_token })}`,
        text: "Older runs",
      })
      : null,
  );
  const updated = h("p", { id: "runs-updated", class: "muted" },
    pageToken ? "An older page: not refreshed." : `Refreshes every ${REFRESH_MS / 1000} s while shown.`);
  const heading = h("h1", { tabindex: "-1", text: "Runs" });
  show(main, heading, form, filter, updated, list, pages);
  document.title = "Runs · Workshop";
  heading.focus();
  if (!pageToken) keepUp({ list, updated, filters, query, alive, last: JSON.stringify(answer.runs) });
}

/** Reads the newest page again every REFRESH_MS while this view is shown and the browser
 * shows the page; repaints the table only when a run changed, keeping the focus on the
 * same run's link. A 401 ends the session; other failures are said and retried. */
function keepUp({ list, updated, filters, query, alive, last }) {
  let seen = last;
  const tick = async () => {
    if (!alive()) return;
    if (document.visibilityState === "visible") {
      try {
        const answer = await api("GET", "/api/workshop/runs", { query });
        if (!alive()) return;
        const now = JSON.stringify(answer.runs);
        if (now !== seen) {
          seen = now;
          const focused = document.activeElement && list.contains(document.activeElement)
            ? document.activeElement.closest("tr") : null;
          const runId = focused ? focused.dataset.runId : "";
          list.replaceChildren(runsTable(filters, answer));
          const again = runId && list.querySelector(`tr[data-run-id="${CSS.escape(runId)}"] a`);
          if (again) again.focus();
        }
        updated.textContent = `Refreshes every ${REFRESH_MS / 1000} s while shown; last read ${new Date().toLocaleTimeString()}.`;
      } catch (error) {
        if (!alive()) return;
        if (error.status === 401) {
          sessionEnded();
          return;
        }
        updated.textContent = `Could not refresh the list (${error.message}); trying again in ${REFRESH_MS / 1000} s.`;
      }
    }
    window.setTimeout(tick, REFRESH_MS);
  };
  window.setTimeout(tick, REFRESH_MS);
}

// The runs page: the newest runs (GET /api/workshop/runs, optionally of one workflow),
// each with its status, mode, job and slot counts, review counts and age, a link to
// each run's page, older pages by the list's page token, and the form to create a run.
import { api, currentSession, signOut } from "./api.js";
import { h, show } from "./dom.js";
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
  return `${c.pending} pending, ${c.accepted} accepted, ${c.rejected} rejected`;
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

export async function runsView({ main, account, params, alive }) {
  const workflow = (params.get("workflow") || "").trim();
  const pageToken = params.get("page") || "";
  const session = await currentSession();
  const [answer, form] = await Promise.all([
    api("GET", "/api/workshop/runs", { query: { workflow, page_token: pageToken } }),
    runForm().catch((error) => {
      if (error.status === 401) throw error;
      return h("p", { class: "error", role: "alert", text: `The form to create a run: ${error.message}` });
    }),
  ]);
  if (!alive()) return;
  accountBar(account, session);

  const input = h("input", { id: "workflow", name: "workflow", value: workflow, autocomplete: "off" });
  const filter = h(
    "form", {
      class: "filter", role: "search", "aria-label": "Filter runs",
      onsubmit: (event) => {
        event.preventDefault();
        const value = input.value.trim();
        go(value ? `#/runs?${new URLSearchParams({ workflow: value })}` : "#/runs");
      },
    },
    h("div", { class: "field" }, h("label", { for: "workflow", text: "Workflow" }), input),
    h("button", { type: "submit", text: "Filter" }),
    workflow
      ? h("button", { type: "button", class: "secondary", onclick: () => go("#/runs"), text: "Show all" })
      : null,
  );

  const scope = workflow ? `of workflow ${workflow}` : "of every workflow";
  const list = answer.runs.length === 0
    ? h("p", { id: "runs-empty", text: workflow ? `No runs of workflow ${workflow}.` : "No runs yet." })
    : h(
      "table", { id: "runs" },
      h("caption", { text: `Recent runs ${scope}, newest first` }),
      h("thead", {}, h("tr", {}, ...["Run", "Workflow", "Status", "Mode", "Jobs", "Slots", "Review", "Age"]
        .map((title) => h("th", { scope: "col", text: title })))),
      h("tbody", {}, answer.runs.map(row)),
    );
  const here = workflow ? { workflow } : {};
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
  const heading = h("h1", { tabindex: "-1", text: "Runs" });
  show(main, heading, form, filter, list, pages);
  document.title = "Runs · Workshop";
  heading.focus();
}

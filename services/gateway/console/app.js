// The console's router. Views live in the URL's fragment (nav.js), so the gateway
// serves one entry page (/) for all of them. Before any view but the login page it asks
// whether the browser is signed in (GET /api/session, which answers 200 either way, so a
// signed-out visit makes no request that fails); without a session it sends the user to
// #/login, and back after signing in. The login page says "Your session has ended" only
// when one did (that answer's `ended`, or any 401 later); a first visit gets it plainly.
import { ApiError, SignedOut, Unreachable, checkSession } from "./api.js";
import { camerasView } from "./cameras.js";
import { datasetsView, versionPageView } from "./datasets.js";
import { h, show } from "./dom.js";
import { editorView } from "./editor.js";
import { keysView } from "./keys.js";
import { loginView } from "./login.js";
import { parseRoute, sessionEnded, toLogin } from "./nav.js";
import { modelsView, runtimesView } from "./resources.js";
import { reviewView } from "./review.js";
import { runView } from "./run.js";
import { runsView } from "./runs.js";
import { summaryView } from "./summary.js";
import { queueView } from "./queue.js";
import { bucketsView } from "./buckets.js";
import { workflowsView } from "./workflows.js";

const VIEWS = {
  login: loginView, runs: runsView, run: runView, review: reviewView, summary: summaryView,
  queue: queueView, buckets: bucketsView,
  workflows: workflowsView, workflow: editorView, models: modelsView, runtimes: runtimesView, keys: keysView,
  cameras: camerasView,
  datasets: datasetsView, version: versionPageView,
};

const account = () => document.getElementById("account");
const main = () => document.getElementById("main");

let generation = 0;

async function render() {
  const mine = ++generation;
  // A view that is still loading when the user moves on shows nothing.
  const alive = () => mine === generation;
  const { name, id, params } = parseRoute(window.location.hash);
  show(account());
  main().removeAttribute("data-view");
  try {
    if (name !== "login") await checkSession();
    await VIEWS[name]({ main: main(), account: account(), id, params, alive });
  } catch (error) {
    if (!alive()) return;
    if (error instanceof SignedOut && !error.ended) {
      toLogin();
      return;
    }
    if (error instanceof ApiError && error.status === 401) {
      sessionEnded();
      return;
    }
    const message = error instanceof ApiError || error instanceof Unreachable
      ? error.message
      : `Something went wrong: ${error}`;
    const heading = h("h1", { tabindex: "-1", text: "This page could not be shown" });
    show(
      main(),
      heading,
      h("p", { class: "error", role: "alert", text: message }),
      h("button", { type: "button", onclick: () => render(), text: "Try again" }),
    );
    heading.focus();
  }
}

window.addEventListener("hashchange", render);
render();

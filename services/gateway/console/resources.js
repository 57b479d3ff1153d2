// Read-only pages of what workflows refer to: runtimes (#/runtimes: GET
// /api/workshop/runtimes, with device, capabilities and last check-in) and models
// (#/models: the catalog's published versions with classes, input shape and weights pin,
// and which workflows use each model's "latest"). Registering runtimes and publishing
// models are an operator's (admin keys, the `workshop` CLI); the pages say so.
import { api, currentSession } from "./api.js";
import { h, scrollBox, show } from "./dom.js";
import { accountBar, age } from "./runs.js";
import { kindOf } from "./workflow_graph.js";

const RECENT_MS = 2 * 60 * 1000; // the website's rule: checked in within 2 minutes

function when(timestamp) {
  if (!timestamp) return h("span", { class: "muted", text: "never" });
  return h("time", { datetime: timestamp, title: new Date(timestamp).toUTCString(), text: age(timestamp) });
}

function page(main, title, ...children) {
  const heading = h("h1", { tabindex: "-1", text: title });
  show(main, heading, ...children);
  document.title = `${title} · Workshop`;
  heading.focus();
}

function table(id, caption, headings, rows) {
  return scrollBox(caption, h("table", { id },
    h("caption", { text: caption }),
    h("thead", {}, h("tr", {}, headings.map((title) => h("th", { scope: "col", text: title })))),
    h("tbody", {}, rows)));
}

export async function runtimesView({ main, account, alive }) {
  const session = await currentSession();
  const answer = await api("GET", "/api/workshop/runtimes", { query: { page_size: "1000" } });
  if (!alive()) return;
  accountBar(account, session);
  const now = Date.now();
  const rows = answer.runtimes.map((r) => {
    const recent = r.last_seen_at && now - Date.parse(r.last_seen_at) <= RECENT_MS;
    return h("tr", { "data-runtime-id": r.runtime_id },
      h("th", { scope: "row" }, h("code", { class: "sha", text: r.runtime_id })),
      h("td", { text: r.device_id }),
      h("td", { text: r.engine }),
      h("td", { text: r.capabilities.length ? r.capabilities.join(", ") : "none" }),
      h("td", {}, when(r.last_seen_at), recent ? " (takes website runs)" : ""),
      h("td", {}, when(r.registered_at)),
      h("td", {}, h("code", { class: "sha", title: r.code_sha256, text: `${r.code_sha256.slice(0, 12)}…` })));
  });
  page(main, "Runtimes",
    h("p", { class: "muted", text: "The website runs a workflow on the newest runtime that checked in within 2 minutes " +
      "with the capabilities it needs (workshop-v3 for keep-by-change and motion). Registering a runtime is an " +
      "operator's task (an admin key or `workshop runtimes register`): read-only here." }),
    answer.runtimes.length === 0
      ? h("p", { id: "runtimes-empty", text: "No runtime is registered yet." })
      : table("runtimes", "Runtimes, newest registration first", ["Runtime", "Device", "Engine", "Capabilities", "Last check-in", "Registered", "Code SHA-256"], rows));
}

/** Per model name, the workflows whose model steps name it: [{workflow, latest}]. */
function usage(workflows) {
  const out = new Map();
  for (const w of workflows) {
    for (const step of w.spec.graph.steps) {
      if (kindOf(step) !== "model") continue;
      const name = step.model.model_name;
      if (!out.has(name)) out.set(name, []);
      out.get(name).push({ workflow: w, latest: step.model.version === undefined, version: step.model.version });
    }
  }
  return out;
}

export async function modelsView({ main, account, alive }) {
  const session = await currentSession();
  const [catalog, workflows] = await Promise.all([
    api("GET", "/api/workshop/catalog"),
    api("GET", "/api/workshop/workflows", { query: { page_size: "1000" } }),
  ]);
  if (!alive()) return;
  accountBar(account, session);
  const used = usage(workflows.workflows);
  const names = [...new Set(catalog.model_versions.map((v) => v.name))];
  const sections = names.map((name) => {
    const versions = catalog.model_versions.filter((v) => v.name === name);
    const users = used.get(name) || [];
    const latest = users.filter((u) => u.latest);
    const link = (u) => h("a", { href: `#/workflow/${encodeURIComponent(u.workflow.workflow_id)}`, text: u.workflow.spec.name || u.workflow.workflow_id });
    return h("section", { class: "model", "data-model": name, "aria-labelledby": `model-${name}` },
      h("h2", { id: `model-${name}`, text: name }),
      h("p", {}, latest.length
        ? ["Uses \"latest\" (the newest version when a run is created): ", ...latest.flatMap((u, i) => [i ? ", " : "", link(u)])]
        : h("span", { class: "muted", text: "No workflow uses \"latest\" of this model." })),
      users.some((u) => !u.latest)
        ? h("p", {}, "Pinned: ", ...users.filter((u) => !u.latest).flatMap((u, i) => [i ? ", " : "", link(u), ` (v${u.version})`]))
        : null,
      table(`versions-${name}`, `Published versions of ${name}`, ["Version", "Classes", "Input shape", "Weights SHA-256", "Decoding", "Published"],
        versions.map((v) => h("tr", { "data-version": String(v.version) },
          h("th", { scope: "row", text: `v${v.version}` }),
          h("td", { text: v.classes.join(", ") }),
          h("td", { text: v.input_shape.join(" × ") }),
          h("td", {}, h("code", { class: "sha", text: v.weights_sha256 })),
          h("td", { text: v.family || "efficient-nms contract" }),
          h("td", {}, when(v.published_at))))));
  });
  page(main, "Models",
    h("p", { class: "muted", text: "Published detection models and their versions (versions never change once published). " +
      "Publishing is an operator's task (an admin key or `workshop models publish`): read-only here." }),
    names.length === 0 ? h("p", { id: "models-empty", text: "No model is published yet." }) : sections);
}

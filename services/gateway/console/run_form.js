// The runs page's form to create a run (folded under "Create a run"): a workflow (GET /api/workshop/workflows), test or
// full, an image limit for tests, the runtime the website's rule picks for the workflow
// (GET .../workflows/{id}/runtime?choice=recent_capable, shown before submitting) and a
// run id the page proposes and the user may change. POST /api/workshop/runs, then on to
// the run page. An error shows the API's message and marks the field it is about.
import { ApiError, api } from "./api.js";
import { h } from "./dom.js";
import { go } from "./nav.js";

/** A fresh run id: the workflow's id, the UTC time to the second and 4 random hex digits. */
export function proposedRunId(workflowId, now = new Date()) {
  const stamp = now.toISOString().slice(0, 19).replace(/[-:]/g, "").replace("T", "-");
  const random = Array.from(crypto.getRandomValues(new Uint8Array(2)), (b) => b.toString(16).padStart(2, "0")).join("");
  return `${workflowId}-${stamp}-${random}`.slice(0, 128);
}

// Which input an error is about, by the field the API names (field_violations,
// metadata "field"), or by the fact its metadata carries.
const FIELD_INPUTS = {
  id: "run-id", run_id: "run-id",
  workflow_id: "run-workflow", revision: "run-workflow",
  runtime_id: "run-runtime",
  mode: "run-mode-test",
  image_limit: "run-limit",
};

function fieldOf(error) {
  const details = error.details || {};
  const violation = (details.field_violations || [])[0];
  const metadata = details.metadata || {};
  const named = (violation && violation.field) || metadata.field || "";
  if (FIELD_INPUTS[named]) return FIELD_INPUTS[named];
  if (error.reason === "STALE_REVISION" || metadata.current_revision) return "run-workflow";
  if (error.reason === "NO_RUNTIME") return "run-runtime";
  if (error.reason === "ALREADY_EXISTS" || metadata.run_id) return "run-id";
  const first = /^(\w+)\b/.exec(error.message || "");
  return first ? FIELD_INPUTS[first[1]] || "" : "";
}

export async function runForm() {
  const answer = await api("GET", "/api/workshop/workflows", { query: { page_size: "200" } });
  const workflows = answer.workflows;
  const error = h("p", { id: "run-error", class: "error", role: "alert", hidden: true });
  const runtimeNote = h("p", { id: "run-runtime-note", class: "muted", "aria-live": "polite" });
  if (workflows.length === 0) {
    return h(
      "details", { class: "panel create-run" },
      h("summary", { id: "create-title", text: "Create a run" }),
      h("p", { class: "muted", text: "No workflows yet: save one first." }),
    );
  }
  const workflow = h("select", { id: "run-workflow", name: "workflow_id" },
    workflows.map((w) => h("option", { value: w.workflow_id, text: `${w.spec.name || w.workflow_id} (${w.workflow_id}, revision ${w.revision})` })));
  const test = h("input", { id: "run-mode-test", type: "radio", name: "mode", value: "test", checked: true });
  const full = h("input", { id: "run-mode-full", type: "radio", name: "mode", value: "full" });
  const limit = h("input", {
    id: "run-limit", name: "image_limit", type: "number", min: "1", max: "100", step: "1", value: "20",
    "aria-describedby": "run-limit-help",
  });
  const limitField = h("div", { class: "field" },
    h("label", { for: "run-limit", text: "Image limit" }), limit,
    h("span", { id: "run-limit-help", class: "muted", text: "Test runs: 1 to 100 images." }));
  const runtime = h("span", { id: "run-runtime", class: "runtime", "aria-describedby": "run-runtime-note" });
  const runId = h("input", {
    id: "run-id", name: "id", autocomplete: "off", spellcheck: "false", required: true,
    maxlength: "128", "aria-describedby": "run-id-help",
  });
  const submit = h("button", { type: "submit", text: "Create run" });
  const inputs = [workflow, test, limit, runId, runtime];
  let chosen = null; // the runtime for the selected workflow
  let choosing = 0;
  let idTouched = false;

  const selected = () => workflows.find((w) => w.workflow_id === workflow.value);

  function clearError() {
    error.hidden = true;
    for (const input of inputs) input.removeAttribute("aria-invalid");
  }

  function showError(failure) {
    error.textContent = failure.message;
    error.hidden = false;
    const id = failure instanceof ApiError ? fieldOf(failure) : "";
    const input = id && document.getElementById(id);
    if (input) input.setAttribute("aria-invalid", "true");
    return input;
  }

  async function chooseRuntime() {
    const mine = ++choosing;
    chosen = null;
    submit.disabled = true;
    runtime.textContent = "choosing…";
    runtime.removeAttribute("aria-invalid");
    setRuntimeNote("");
    const w = selected();
    try {
      const reply = await api("GET", `/api/workshop/workflows/${encodeURIComponent(w.workflow_id)}/runtime`, {
        query: { choice: "recent_capable" },
      });
      if (mine !== choosing) return;
      chosen = reply.runtime;
      runtime.textContent = chosen.runtime_id;
      setRuntimeNote(`${chosen.engine} on device ${chosen.device_id}, code SHA-256 ${chosen.code_sha256.slice(0, 12)}…: ` +
        "the newest runtime that checked in within 2 minutes and can run this workflow.");
      submit.disabled = false;
    } catch (failure) {
      if (mine !== choosing) return;
      if (failure instanceof ApiError && failure.status === 401) throw failure;
      runtime.textContent = "none";
      runtime.setAttribute("aria-invalid", "true");
      setRuntimeNote(failure.message);
    }
  }

  function setRuntimeNote(text) {
    runtimeNote.textContent = text;
  }

  function modeChanged() {
    limitField.hidden = full.checked;
  }

  workflow.addEventListener("change", () => {
    clearError();
    if (!idTouched) runId.value = proposedRunId(workflow.value);
    chooseRuntime();
  });
  runId.addEventListener("input", () => { idTouched = true; });
  for (const input of [runId, limit]) {
    input.addEventListener("input", () => input.removeAttribute("aria-invalid"));
  }
  test.addEventListener("change", modeChanged);
  full.addEventListener("change", modeChanged);

  async function onsubmit(event) {
    event.preventDefault();
    if (!chosen) return;
    clearError();
    submit.disabled = true;
    const w = selected();
    const mode = full.checked ? "full" : "test";
    const typed = limit.value.trim();
    const body = {
      id: runId.value.trim(),
      workflow_id: w.workflow_id,
      runtime_id: chosen.runtime_id,
      revision: w.revision,
      mode,
      // Only test runs have a limit; a number the field cannot read goes as typed, so
      // the API names what is wrong with it.
      image_limit: mode === "test" ? (/^-?\d+$/.test(typed) ? Number(typed) : typed) : null,
    };
    try {
      const created = await api("POST", "/api/workshop/runs", { body });
      go(`#/run/${encodeURIComponent(created.run.run_id)}`);
    } catch (failure) {
      if (failure instanceof ApiError && failure.status === 401) throw failure;
      (showError(failure) || submit).focus();
      submit.disabled = false;
    }
  }

  const form = h(
    "form", { id: "create-run", onsubmit, "aria-describedby": "run-error" },
    h("div", { class: "field" }, h("label", { for: "run-workflow", text: "Workflow to run" }), workflow),
    h("fieldset", { class: "field" }, h("legend", { text: "Mode" }),
      h("span", { class: "choice" }, test, h("label", { for: "run-mode-test", text: "Test (images kept for an hour)" })),
      h("span", { class: "choice" }, full, h("label", { for: "run-mode-full", text: "Full (saved into buckets)" }))),
    limitField,
    h("div", { class: "field" }, h("span", { class: "label", id: "run-runtime-label", text: "Runtime" }), runtime, runtimeNote),
    h("div", { class: "field" }, h("label", { for: "run-id", text: "Run id" }), runId,
      h("span", { id: "run-id-help", class: "muted", text: "Proposed; change it if you like (letters, digits, '.', '_', '-')." })),
    error,
    submit,
  );
  runtime.setAttribute("aria-labelledby", "run-runtime-label");
  runId.value = proposedRunId(workflow.value);
  // Folded by default, so the list of runs stays at the top of the page.
  const section = h("details", { class: "panel create-run" },
    h("summary", { id: "create-title", text: "Create a run" }), form);
  chooseRuntime().catch(() => {});
  return section;
}

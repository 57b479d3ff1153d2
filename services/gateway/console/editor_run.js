// The editor's run controls: the test's image count (1-100) beside Run test, Run full
// (confirmed, naming the buckets it writes into), and the runtime the website's rule
// picks (GET .../workflows/{id}/runtime?choice=recent_capable: the newest runtime that
// checked in within 2 minutes with the capabilities the workflow needs), or why none
// qualifies. Both runs save unsaved changes first, then POST /api/workshop/runs with a
// fresh client id and open the run's live page.
import { ApiError, api } from "./api.js";
import { h } from "./dom.js";
import { go } from "./nav.js";
import { proposedRunId } from "./run_form.js";
import { age } from "./runs.js";
import { outputBuckets } from "./workflow_graph.js";

export class RunBar {
  constructor(editor) {
    this.editor = editor;
    this.choosing = 0;
  }

  build() {
    this.images = h("input", {
      id: "test-images", type: "number", min: "1", max: "100", step: "1", value: "20",
      inputmode: "numeric", "aria-describedby": "test-images-help",
    });
    this.images.addEventListener("input", () => this.images.removeAttribute("aria-invalid"));
    this.testButton = h("button", { type: "button", id: "run-test", text: "Run test", onclick: () => this.run("test") });
    this.fullButton = h("button", { type: "button", id: "run-full", class: "secondary", text: "Run full…", onclick: () => this.run("full") });
    this.runtime = h("p", { id: "editor-runtime", "aria-live": "polite" });
    return h("div", { class: "run-controls" },
      h("div", { class: "run-bar" },
        h("span", { class: "inline-field" }, h("label", { for: "test-images", text: "Test images" }), this.images),
        this.testButton, this.fullButton),
      h("p", { id: "test-images-help", class: "muted", text: "A test run labels 1 to 100 images and keeps them for an hour; a full run saves into the buckets." }),
      this.runtime);
  }

  /** Asks which runtime would run the saved workflow now; the runtime, or null (the
   * page then says why none qualifies). */
  async chooseRuntime() {
    const editor = this.editor;
    const mine = ++this.choosing;
    if (editor.isNew) {
      this.runtime.textContent = "Runtime: chosen once the workflow is saved.";
      return null;
    }
    this.runtime.textContent = "Runtime: choosing…";
    try {
      const answer = await api("GET", `/api/workshop/workflows/${encodeURIComponent(editor.workflowId)}/runtime`, {
        query: { choice: "recent_capable" },
      });
      const runtime = answer.runtime;
      if (mine === this.choosing) {
        const needs = runtime.capabilities.length ? `capabilities ${runtime.capabilities.join(", ")}` : "no capabilities";
        const seen = runtime.last_seen_at ? `checked in ${age(runtime.last_seen_at)}` : "never checked in";
        this.runtime.textContent = `Runtime: ${runtime.runtime_id} (${runtime.engine} on ${runtime.device_id}, ${seen}, ${needs}), ` +
          "the newest that checked in within 2 minutes and can run this workflow.";
        this.runtime.classList.remove("error");
      }
      return runtime;
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        editor.onSignedOut();
        return null;
      }
      if (mine === this.choosing) {
        this.runtime.textContent = `No runtime qualifies: ${error.message}`;
        this.runtime.classList.add("error");
      }
      return null;
    }
  }

  async run(mode) {
    const editor = this.editor;
    editor.clearError();
    const typed = this.images.value.trim();
    const count = Number(typed);
    if (mode === "test" && !(/^\d+$/.test(typed) && count >= 1 && count <= 100)) {
      editor.showError("The test's image count is a whole number from 1 to 100.", this.images);
      return;
    }
    if (mode === "full") {
      const buckets = outputBuckets(editor.spec);
      const into = buckets.length ? `into bucket${buckets.length === 1 ? "" : "s"} ${buckets.join(", ")}` : "into no bucket (the workflow names none)";
      const first = editor.dirty ? " Your changes are saved first." : "";
      if (!window.confirm(`Run full: every matching frame is saved ${into}.${first} Start a full run?`)) return;
    }
    this.testButton.disabled = true;
    this.fullButton.disabled = true;
    try {
      if (editor.dirty && !(await editor.save())) return;
      const runtime = await this.chooseRuntime();
      if (!runtime) {
        editor.showError(this.runtime.textContent);
        return;
      }
      const body = {
        id: proposedRunId(editor.workflowId),
        workflow_id: editor.workflowId,
        runtime_id: runtime.runtime_id,
        revision: editor.revision,
        mode,
        image_limit: mode === "test" ? count : null,
      };
      const created = await api("POST", "/api/workshop/runs", { body });
      go(`#/run/${encodeURIComponent(created.run.run_id)}`);
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) editor.onSignedOut();
      else editor.showError(`The run was not created: ${error.message}`);
    } finally {
      this.testButton.disabled = false;
      this.fullButton.disabled = false;
    }
  }
}

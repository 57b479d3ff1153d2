// What the editor does when Save meets a stale revision (409 STALE_REVISION): nothing is
// overwritten. A modal dialog says which revision is saved now and offers the choice:
// see what changed (the saved document against the page's), reload the saved one
// (dropping the page's edits), save the page's document as a copy under a new id, or
// keep editing.
import { ApiError, api } from "./api.js";
import { h } from "./dom.js";
import { differences } from "./workflow_graph.js";

export class Conflict {
  constructor(editor) {
    this.editor = editor;
    this.theirs = null;
  }

  build() {
    this.title = h("h2", { id: "conflict-title", text: "This workflow was saved meanwhile" });
    this.text = h("p", { id: "conflict-text" });
    this.changes = h("div", { id: "conflict-changes", hidden: true });
    this.error = h("p", { class: "error", role: "alert", hidden: true });
    this.copyId = h("input", { id: "copy-id", autocomplete: "off", spellcheck: "false", maxlength: "128" });
    this.copyForm = h("form", {
      class: "copy-form", hidden: true, onsubmit: (event) => {
        event.preventDefault();
        this.saveCopy();
      },
    }, h("label", { for: "copy-id", text: "Id of the copy" }), this.copyId,
    h("button", { type: "submit", text: "Save the copy" }));
    this.seeButton = h("button", { type: "button", class: "secondary", text: "See what changed", onclick: () => this.see() });
    this.reloadButton = h("button", { type: "button", class: "secondary", onclick: () => this.reload() });
    this.dialog = h("dialog", { id: "conflict", class: "conflict", "aria-labelledby": "conflict-title", "aria-describedby": "conflict-text" },
      this.title, this.text,
      h("div", { class: "actions" },
        this.seeButton, this.reloadButton,
        h("button", { type: "button", class: "secondary", text: "Save mine as a copy", onclick: () => this.askCopy() }),
        h("button", { type: "button", class: "secondary", text: "Keep editing", onclick: () => this.dialog.close() })),
      this.changes, this.copyForm, this.error);
    return this.dialog;
  }

  async open(error) {
    const editor = this.editor;
    const current = error.details.metadata ? error.details.metadata.current_revision : "";
    this.theirs = null;
    this.changes.hidden = true;
    this.copyForm.hidden = true;
    this.error.hidden = true;
    this.text.textContent = editor.isNew
      ? `A workflow with the id "${editor.workflowId}" already exists (revision ${current}). Nothing was overwritten.`
      : `You are editing revision ${editor.revision}; revision ${current} was saved since. Nothing was overwritten: choose what to do with your changes.`;
    this.reloadButton.textContent = `Reload revision ${current} (drop my changes)`;
    this.dialog.showModal();
    this.seeButton.focus();
  }

  async fetchTheirs() {
    if (!this.theirs) {
      const answer = await api("GET", `/api/workshop/workflows/${encodeURIComponent(this.editor.workflowId)}`);
      this.theirs = answer.workflow;
    }
    return this.theirs;
  }

  async see() {
    try {
      const theirs = await this.fetchTheirs();
      const found = differences(theirs.spec, this.editor.spec);
      const by = theirs.updated_by ? theirs.updated_by.display_name || theirs.updated_by.user_id : "someone";
      this.changes.replaceChildren(
        h("h3", { text: `Revision ${theirs.revision} (saved by ${by}) against yours` }),
        found.length
          ? h("ul", { id: "conflict-list" }, found.map((line) => h("li", { text: line })))
          : h("p", { text: "No difference in the document: reload it and save again." }));
      this.changes.hidden = false;
    } catch (error) {
      this.fail(error);
    }
  }

  async reload() {
    try {
      const theirs = await this.fetchTheirs();
      this.dialog.close();
      this.editor.reload(theirs);
      this.editor.announce(`Reloaded revision ${theirs.revision}; your changes were dropped.`);
      this.editor.heading.focus();
    } catch (error) {
      this.fail(error);
    }
  }

  askCopy() {
    this.copyId.value = `${this.editor.workflowId}-copy`.slice(0, 128);
    this.copyForm.hidden = false;
    this.copyId.focus();
  }

  async saveCopy() {
    const editor = this.editor;
    const id = this.copyId.value.trim();
    const spec = structuredClone(editor.spec);
    spec.name = `${spec.name || editor.workflowId} (copy)`.slice(0, 200);
    try {
      const answer = await api("PUT", `/api/workshop/workflows/${encodeURIComponent(id)}`, {
        body: { expected_revision: 0, spec },
      });
      this.dialog.close();
      editor.revision = 0; // the page now edits the copy, a new workflow until taken
      editor.takeSaved(answer.workflow);
      editor.announce(`Saved your changes as workflow "${id}" (revision 1).`);
      editor.heading.focus();
    } catch (error) {
      this.fail(error);
      this.copyId.setAttribute("aria-invalid", "true");
      this.copyId.focus();
    }
  }

  fail(error) {
    if (error instanceof ApiError && error.status === 401) {
      this.dialog.close();
      this.editor.onSignedOut();
      return;
    }
    this.error.textContent = error.message;
    this.error.hidden = false;
  }
}

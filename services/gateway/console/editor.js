// The workflow editor (#/workflow/<id>, #/workflow for a new one): the document's name,
// time zone and schedule, its graph (editor_canvas.js) and the selected step's panel
// (editor_panel.js). Every edit is checked by the server's ValidateWorkflow
// (POST /api/workshop/workflows/validate, 250 ms after the last edit) and each problem is
// written on the step or edge it concerns. Save sends the revision the page holds
// (PUT /api/workshop/workflows/{id}); a stale one opens a choice (editor_conflict.js),
// never an overwrite. Run test and Run full (editor_run.js) save first.
// Step positions are the page's own (the document has none): laid out by depth, kept in
// this browser's localStorage per workflow once moved.
import { ApiError, api, currentSession } from "./api.js";
import { h, show } from "./dom.js";
import { Canvas } from "./editor_canvas.js";
import { Conflict } from "./editor_conflict.js";
import { Panel } from "./editor_panel.js";
import { RunBar } from "./editor_run.js";
import { sessionEnded } from "./nav.js";
import { accountBar, age } from "./runs.js";
import {
  KINDS, KIND_NAMES, branchFor, clock, emptySpec, hasEdge, layout, newStep, placeNew,
  problemTarget, timeOfDay,
} from "./workflow_graph.js";

const VALIDATE_AFTER_MS = 250;
const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

const layoutKey = (workflowId) => `workshop:layout:${workflowId}`;

function storedLayout(workflowId) {
  try {
    return JSON.parse(window.localStorage.getItem(layoutKey(workflowId)) || "{}");
  } catch {
    return {};
  }
}

function zones() {
  try {
    return Intl.supportedValuesOf("timeZone");
  } catch {
    return ["UTC"];
  }
}

export class Editor {
  constructor({ workflow, catalog }) {
    this.catalog = catalog;
    this.load(workflow);
    this.problems = [];
    this.capabilities = [];
    this.validating = 0;
    this.timer = 0;
    this.canvas = new Canvas(this);
    this.panel = new Panel(this);
    this.runBar = new RunBar(this);
    this.conflict = new Conflict(this);
  }

  /** Takes `workflow` (null: a new one) as the page's document, unchanged. */
  load(workflow) {
    this.workflow = workflow;
    this.workflowId = workflow ? workflow.workflow_id : "";
    this.revision = workflow ? workflow.revision : 0;
    this.spec = workflow ? structuredClone(workflow.spec) : emptySpec();
    if (!this.spec.graph) this.spec.graph = { steps: [], edges: [] };
    this.saved = workflow ? JSON.stringify(workflow.spec) : "";
    const placed = {};
    const stored = this.workflowId ? storedLayout(this.workflowId) : {};
    for (const step of this.spec.graph.steps) if (stored[step.step_id]) placed[step.step_id] = stored[step.step_id];
    this.positions = layout(this.spec, placed);
    this.selected = null;
  }

  get isNew() {
    return this.revision === 0;
  }

  get dirty() {
    return this.isNew || JSON.stringify(this.spec) !== this.saved;
  }

  stepById(id) {
    return this.spec.graph.steps.find((s) => s.step_id === id);
  }

  // --- problems, by where they belong

  targets() {
    return this.problems.map((p) => ({ problem: p, target: problemTarget(this.spec, p) }));
  }

  stepProblems() {
    const out = new Map();
    for (const { problem, target } of this.targets()) {
      if (target.step === undefined) continue;
      if (!out.has(target.step)) out.set(target.step, []);
      out.get(target.step).push(problem);
    }
    return out;
  }

  edgeProblems() {
    const out = new Map();
    for (const { problem, target } of this.targets()) {
      if (target.edge === undefined) continue;
      if (!out.has(target.edge)) out.set(target.edge, []);
      out.get(target.edge).push(problem);
    }
    return out;
  }

  problemsOf(selected) {
    if (!selected) return [];
    return this.targets().filter(({ target }) => (selected.step !== undefined && target.step === selected.step)
      || (selected.edge !== undefined && target.edge === selected.edge)
      || (selected.document !== undefined && target.document === selected.document)).map(({ problem }) => problem);
  }

  // --- edits

  /** Any change of the document: repaint, mark unsaved, validate soon. */
  changed({ panel = false } = {}) {
    this.canvas.paint();
    if (panel) this.panel.render();
    this.paintState();
    window.clearTimeout(this.timer);
    this.timer = window.setTimeout(() => this.validate(), VALIDATE_AFTER_MS);
  }

  update(stepId, change, { panel = false } = {}) {
    const step = this.stepById(stepId);
    if (!step) return;
    change(step);
    this.changed({ panel });
  }

  select(target, { focus = false } = {}) {
    const same = JSON.stringify(target) === JSON.stringify(this.selected);
    this.selected = target;
    if (!same) {
      this.canvas.paint();
      this.panel.render();
    }
    if (focus === "panel") this.panel.focusTitle();
    else if (focus === "node" && target && target.step !== undefined) this.canvas.focusStep(target.step);
  }

  addStep(kind) {
    const step = newStep(kind, this.spec.graph.steps, this.catalog);
    const from = this.selected && this.selected.step !== undefined ? this.stepById(this.selected.step) : null;
    this.positions[step.step_id] = placeNew(this.positions, from ? this.positions[from.step_id] : null);
    this.spec.graph.steps.push(step);
    // Added after the selected step when it may follow it, on that step's free branch.
    const branch = from ? branchFor(this.spec, from, step) : "";
    if (branch) this.spec.graph.edges.push({ from_step_id: from.step_id, to_step_id: step.step_id, branch });
    this.announce(branch
      ? `Added ${KIND_NAMES[kind]} step "${step.step_id}" after "${from.step_id}".`
      : `Added ${KIND_NAMES[kind]} step "${step.step_id}".`);
    this.selected = { step: step.step_id };
    this.changed({ panel: true });
    this.saveLayout();
    this.canvas.focusStep(step.step_id);
  }

  deleteStep(stepId) {
    const index = this.spec.graph.steps.findIndex((s) => s.step_id === stepId);
    if (index < 0) return;
    this.spec.graph.steps.splice(index, 1);
    this.spec.graph.edges = this.spec.graph.edges.filter((e) => e.from_step_id !== stepId && e.to_step_id !== stepId);
    delete this.positions[stepId];
    const next = this.spec.graph.steps[Math.min(index, this.spec.graph.steps.length - 1)];
    this.selected = next ? { step: next.step_id } : null;
    this.announce(`Deleted step "${stepId}" and its edges.`);
    this.changed({ panel: true });
    this.saveLayout();
    if (next) this.canvas.focusStep(next.step_id);
    else this.addButtons[0].focus();
  }

  connect(from, to, branch) {
    if (hasEdge(this.spec, from, to, branch)) return;
    this.spec.graph.edges.push({ from_step_id: from, to_step_id: to, branch });
    this.announce(`Connected "${from}" to "${to}"${branch === "next" ? "" : ` (${branch.replace("_", " ")})`}.`);
    this.changed({ panel: true });
  }

  removeEdge(index) {
    const [edge] = this.spec.graph.edges.splice(index, 1);
    if (this.selected && this.selected.edge !== undefined) this.selected = { step: edge.from_step_id };
    this.announce(`Removed the edge "${edge.from_step_id}" to "${edge.to_step_id}".`);
    this.changed({ panel: true });
    if (this.selected && this.selected.step !== undefined) this.panel.focusTitle();
  }

  /** Renames a step (its edges follow); a message when the id cannot be used. */
  renameStep(from, to) {
    if (to === from) return "";
    if (!ID_PATTERN.test(to) || to.length > 64) {
      return "A step id is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit.";
    }
    if (this.stepById(to)) return `Another step is called "${to}".`;
    this.stepById(from).step_id = to;
    for (const edge of this.spec.graph.edges) {
      if (edge.from_step_id === from) edge.from_step_id = to;
      if (edge.to_step_id === from) edge.to_step_id = to;
    }
    this.positions[to] = this.positions[from];
    delete this.positions[from];
    this.canvas.nodes.set(to, this.canvas.nodes.get(from));
    this.canvas.nodes.delete(from);
    this.selected = { step: to };
    this.changed({ panel: true });
    this.saveLayout();
    return "";
  }

  move(stepId, dx, dy) {
    const p = this.positions[stepId];
    this.moveTo(stepId, { x: Math.max(0, p.x + dx), y: Math.max(0, p.y + dy) });
    this.moved();
  }

  moveTo(stepId, position) {
    this.positions[stepId] = position;
    this.canvas.place(stepId);
  }

  /** Lays every step out again by depth (columns) and document order (rows). */
  arrange() {
    this.positions = layout(this.spec, {});
    this.canvas.paint();
    this.saveLayout();
    this.announce("Arranged the steps by depth.");
  }

  moved() {
    this.saveLayout();
  }

  saveLayout() {
    if (!this.workflowId || this.isNew) return;
    try {
      window.localStorage.setItem(layoutKey(this.workflowId), JSON.stringify(this.positions));
    } catch {
      // a full or forbidden storage: positions are the page's own, lost on reload
    }
  }

  // --- validation

  async validate() {
    window.clearTimeout(this.timer);
    const mine = ++this.validating;
    this.setCheck("Checking…");
    const started = performance.now();
    let problems;
    let capabilities = [];
    try {
      const answer = await api("POST", "/api/workshop/workflows/validate", { body: { spec: this.spec } });
      problems = answer.problems;
      capabilities = answer.required_capabilities;
    } catch (error) {
      if (mine !== this.validating) return;
      if (error instanceof ApiError && error.status === 400) {
        // A field the gateway could not read: its violations, placed like problems.
        problems = (error.details.field_violations || []).map((v) => ({ path: v.field, message: `${v.field}: ${v.description}`, step_id: "" }));
      } else {
        if (error instanceof ApiError && error.status === 401) this.onSignedOut();
        this.setCheck(`Could not check the workflow: ${error.message}`);
        return;
      }
    }
    if (mine !== this.validating) return;
    this.showProblems(problems);
    this.capabilities = capabilities;
    performance.measure("workshop:validation", { start: started, end: performance.now() });
  }

  showProblems(problems) {
    this.problems = problems;
    this.canvas.paint();
    this.panel.showProblems();
    this.paintProblems();
  }

  // --- saving

  /** Saves the document against the page's revision; true once saved. A stale revision
   * opens the conflict dialog; other refusals are shown. */
  async save() {
    this.clearError();
    if (this.isNew) {
      const id = this.idInput.value.trim();
      if (!ID_PATTERN.test(id)) {
        this.showError("Give the workflow an id: letters, digits, '.', '_' or '-', up to 128, starting with a letter or digit.", this.idInput);
        return false;
      }
      this.workflowId = id;
    }
    this.saveButton.disabled = true;
    this.setSaveState("Saving…");
    try {
      const answer = await api("PUT", `/api/workshop/workflows/${encodeURIComponent(this.workflowId)}`, {
        body: { expected_revision: this.revision, spec: this.spec },
      });
      this.takeSaved(answer.workflow);
      this.announce(`Saved revision ${this.revision}.`);
      return true;
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) {
        this.onSignedOut();
        return false;
      }
      if (error instanceof ApiError && error.reason === "STALE_REVISION") {
        this.paintState();
        await this.conflict.open(error);
        return false;
      }
      if (error instanceof ApiError && error.reason === "VALIDATION_FAILED") {
        this.showProblems(error.details.problems || []);
      }
      if (this.isNew && error instanceof ApiError && error.reason === "ID_CONFLICT") {
        this.showError(error.message, this.idInput);
      } else {
        this.showError(error.message);
      }
      this.paintState();
      return false;
    } finally {
      this.saveButton.disabled = false;
    }
  }

  takeSaved(workflow) {
    const wasNew = this.isNew;
    const positions = this.positions;
    const selected = this.selected;
    this.workflow = workflow;
    this.workflowId = workflow.workflow_id;
    this.revision = workflow.revision;
    this.saved = JSON.stringify(workflow.spec);
    this.spec = structuredClone(workflow.spec);
    this.positions = positions;
    this.selected = selected;
    this.saveLayout();
    if (wasNew) {
      // The page is now this workflow's (no hashchange: the view stays as it is).
      window.history.replaceState(null, "", `#/workflow/${encodeURIComponent(this.workflowId)}`);
      this.idInput.value = this.workflowId;
      this.idInput.readOnly = true;
    }
    this.paintDocument();
    this.canvas.paint();
    this.panel.render();
    this.paintState();
    this.runBar.chooseRuntime();
  }

  /** Drops the page's edits for the saved `workflow` (the conflict dialog's Reload). */
  reload(workflow) {
    this.load(workflow);
    this.problems = [];
    this.idInput.value = this.workflowId;
    this.idInput.readOnly = true;
    this.paintDocument();
    this.canvas.paint();
    this.panel.render();
    this.paintState();
    this.validate();
    this.runBar.chooseRuntime();
  }

  // --- the page

  build() {
    this.heading = h("h1", { tabindex: "-1" });
    this.state = h("p", { id: "editor-state", class: "muted" });
    this.idInput = h("input", {
      id: "workflow-id", autocomplete: "off", spellcheck: "false", maxlength: "128", required: true,
      value: this.workflowId, readonly: !this.isNew, "aria-describedby": "workflow-id-help",
    });
    this.nameInput = h("input", { id: "workflow-name", maxlength: "200", autocomplete: "off", "data-field": "name" });
    this.nameInput.addEventListener("input", () => {
      this.spec.name = this.nameInput.value;
      this.changed();
    });
    this.zoneInput = h("input", {
      id: "workflow-zone", list: "zones", autocomplete: "off", spellcheck: "false", "data-field": "time_zone",
      "aria-describedby": "workflow-zone-help",
    });
    this.zoneInput.addEventListener("input", () => {
      this.spec.time_zone = this.zoneInput.value.trim();
      this.changed();
    });
    this.scheduleBox = h("input", { id: "schedule-on", type: "checkbox", "data-field": "schedule" });
    this.scheduleTime = h("input", { id: "schedule-time", type: "time", "data-field": "schedule" });
    const scheduleChanged = () => {
      const time = timeOfDay(this.scheduleTime.value);
      if (this.scheduleBox.checked) this.spec.schedule = { time_of_day: time || { hours: 0, minutes: 0, seconds: 0 } };
      else delete this.spec.schedule;
      this.scheduleTime.disabled = !this.scheduleBox.checked;
      this.changed();
    };
    this.scheduleBox.addEventListener("change", () => {
      if (this.scheduleBox.checked && !this.scheduleTime.value) this.scheduleTime.value = "06:00";
      scheduleChanged();
    });
    this.scheduleTime.addEventListener("change", scheduleChanged);
    this.documentProblems = h("ul", { id: "document-problems", class: "error", hidden: true, "aria-label": "Problems of the document" });
    const documentPanel = h("section", { class: "panel document", "aria-labelledby": "document-title" },
      h("h2", { id: "document-title", text: "Workflow" }),
      h("div", { class: "field-row" },
        h("div", { class: "field" }, h("label", { for: "workflow-id", text: "Id" }), this.idInput,
          h("span", { id: "workflow-id-help", class: "muted", text: this.isNew ? "Chosen once; letters, digits, '.', '_', '-'." : "Fixed once saved." })),
        h("div", { class: "field" }, h("label", { for: "workflow-name", text: "Name" }), this.nameInput)),
      h("div", { class: "field-row" },
        h("div", { class: "field" }, h("label", { for: "workflow-zone", text: "Time zone" }), this.zoneInput,
          h("span", { id: "workflow-zone-help", class: "muted", text: "IANA name; the day, the window and the schedule are local times here." }),
          h("datalist", { id: "zones" }, zones().map((z) => h("option", { value: z })))),
        h("fieldset", { class: "field schedule" }, h("legend", { text: "Schedule" }),
          h("span", { class: "choice" }, this.scheduleBox, h("label", { for: "schedule-on", text: "A full run every day at" })),
          h("label", { for: "schedule-time", class: "visually-hidden", text: "Time of the daily run" }), this.scheduleTime)),
      this.documentProblems);

    this.addButtons = KINDS.map((kind) => h("button", {
      type: "button", class: "secondary", "data-add": kind, text: KIND_NAMES[kind],
      "aria-label": `Add a ${KIND_NAMES[kind].toLowerCase()} step`,
      onclick: () => this.addStep(kind),
    }));
    const arrange = h("button", {
      type: "button", class: "secondary", id: "arrange", text: "Arrange",
      "aria-label": "Arrange the steps by depth", onclick: () => this.arrange(),
    });
    const toolbar = h("div", { class: "toolbar", role: "toolbar", "aria-label": "Add a step" },
      h("span", { class: "label", text: "Add a step:" }), this.addButtons, arrange);
    const help = h("p", { id: "graph-help", class: "muted" },
      "Tab to a step to open it in the panel; arrow keys move it (Shift: farther), Delete removes it, Enter goes to its panel. " +
      "Drag a step to move it, or from its right edge onto another step to connect them. A new step follows the selected one when it may.");
    this.check = h("p", { id: "validation", role: "status", class: "muted" });
    this.problemList = h("ul", { id: "problems", class: "problem-list" });
    this.announcer = h("p", { id: "editor-announce", class: "visually-hidden", role: "status" });
    this.error = h("p", { id: "editor-error", class: "error", role: "alert", hidden: true });
    this.saveButton = h("button", { type: "button", id: "save", text: "Save", onclick: () => this.save() });
    this.saveState = h("span", { id: "save-state", class: "muted" });

    const workspace = h("div", { class: "workspace" },
      h("section", { class: "graph-area", "aria-label": "Graph" }, toolbar, help, this.canvas.element),
      this.panel.element);
    const actions = h("section", { class: "panel editor-actions", "aria-label": "Save and run" },
      h("div", { class: "actions" }, this.saveButton, this.saveState),
      this.runBar.build(), this.error);
    this.paintDocument();
    return [this.heading, this.state, documentPanel, actions,
      h("section", { class: "checks-area", "aria-label": "Validation" }, this.check, this.problemList),
      workspace, this.announcer, this.conflict.build()];
  }

  paintDocument() {
    this.nameInput.value = this.spec.name || "";
    this.zoneInput.value = this.spec.time_zone || "";
    this.scheduleBox.checked = !!this.spec.schedule;
    this.scheduleTime.value = this.spec.schedule ? clock(this.spec.schedule.time_of_day) : "";
    this.scheduleTime.disabled = !this.spec.schedule;
    const title = this.isNew ? "New workflow" : `Workflow ${this.spec.name || this.workflowId}`;
    this.heading.textContent = title;
    document.title = `${title} · Workshop`;
  }

  paintState() {
    if (this.isNew) {
      this.state.textContent = "Not saved yet.";
    } else {
      const by = this.workflow.updated_by ? ` by ${this.workflow.updated_by.display_name || this.workflow.updated_by.user_id || "someone"}` : "";
      this.state.textContent = `Revision ${this.revision}, saved ${age(this.workflow.updated_at)}${by}.`;
    }
    this.setSaveState(this.dirty ? (this.isNew ? "Not saved yet" : "Unsaved changes") : "All changes saved");
  }

  paintProblems() {
    const n = this.problems.length;
    this.setCheck(n === 0 ? "No problems: the workflow is valid." : `${n} problem${n === 1 ? "" : "s"} to fix.`);
    const rows = this.targets().map(({ problem, target }) => {
      const where = target.step !== undefined ? `Step "${target.step}"` : target.edge !== undefined ? "Edge" : "Workflow";
      const go = target.step !== undefined || target.edge !== undefined
        ? h("button", {
          type: "button", class: "secondary small", text: "Show",
          "aria-label": `Show ${where === "Edge" ? "the edge" : where}`,
          onclick: () => this.select(target.step !== undefined ? { step: target.step } : { edge: target.edge }, { focus: target.step !== undefined ? "node" : "panel" }),
        })
        : null;
      return h("li", {}, h("span", { text: `${where}: ${problem.message}` }), go);
    });
    this.problemList.replaceChildren(...rows);
    const own = this.targets().filter(({ target }) => target.document !== undefined && target.document !== "graph");
    this.documentProblems.replaceChildren(...own.map(({ problem }) => h("li", { text: problem.message })));
    this.documentProblems.hidden = own.length === 0;
    const fields = new Set(own.map(({ target }) => target.document));
    for (const input of [this.nameInput, this.zoneInput, this.scheduleBox, this.scheduleTime]) {
      if (fields.has(input.dataset.field)) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
  }

  setCheck(text) {
    if (this.check.textContent !== text) this.check.textContent = text;
  }

  setSaveState(text) {
    this.saveState.textContent = text;
  }

  announce(text) {
    this.announcer.textContent = text;
  }

  clearError() {
    this.error.hidden = true;
    this.idInput.removeAttribute("aria-invalid");
  }

  showError(message, input) {
    this.error.textContent = message;
    this.error.hidden = false;
    if (input) {
      input.setAttribute("aria-invalid", "true");
      input.focus();
    }
  }

  onSignedOut() {
    sessionEnded();
  }
}

export async function editorView({ main, account, id, alive }) {
  const session = await currentSession();
  const [catalog, answer] = await Promise.all([
    api("GET", "/api/workshop/catalog"),
    id ? api("GET", `/api/workshop/workflows/${encodeURIComponent(id)}`) : Promise.resolve(null),
  ]);
  if (!alive()) return;
  accountBar(account, session);
  const editor = new Editor({ workflow: answer ? answer.workflow : null, catalog });
  main.dataset.view = "editor"; // a wider page for the graph
  show(main, editor.build());
  editor.canvas.paint();
  editor.panel.render();
  editor.paintState();
  editor.heading.focus();
  // After the frame that shows the graph has been painted (bench/editor.py reads it).
  requestAnimationFrame(() => requestAnimationFrame(() => performance.mark("workshop:editor-painted")));
  editor.validate();
  editor.runBar.chooseRuntime();
}

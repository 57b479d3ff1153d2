// The editor's side panel for the selected step (or edge): its fields, with pickers fed
// by the catalog (cameras, published model versions and their classes, buckets), its
// validation messages, its edges (remove, and connect: the keyboard's way to draw one),
// and Delete step. Fields a problem's path names are marked aria-invalid.
import { h } from "./dom.js";
import {
  BRANCH_NAMES, KIND_NAMES, branchesOf, canFollow, clock, hasEdge, kindOf, problemField,
  ruleClasses, timeOfDay,
} from "./workflow_graph.js";

const DAYS = [
  ["previous_day", "The day before the run"],
  ["run_day", "The day of the run"],
  ["date", "A fixed date"],
];

function field(id, label, input, help) {
  input.id = id;
  if (help) input.setAttribute("aria-describedby", `${id}-help`);
  return h("div", { class: "field" }, h("label", { for: id, text: label }), input,
    help ? h("span", { id: `${id}-help`, class: "muted", text: help }) : null);
}

function checkbox(id, label, checked, onchange, extra = {}) {
  return h("span", { class: "choice" },
    h("input", { id, type: "checkbox", checked, onchange, ...extra }),
    h("label", { for: id, text: label }));
}

function finite(value, fallback = 0) {
  const n = Number.parseFloat(value);
  return Number.isFinite(n) ? n : fallback;
}

function isoDate(date) {
  if (!date || !date.year) return "";
  const pad = (n) => String(n).padStart(2, "0");
  return `${String(date.year).padStart(4, "0")}-${pad(date.month)}-${pad(date.day)}`;
}

export class Panel {
  constructor(editor) {
    this.editor = editor;
    this.element = h("section", { class: "panel step-panel", id: "step-panel", "aria-labelledby": "panel-title" });
  }

  /** Builds the panel for the current selection; keeps the focus on the same field. */
  render() {
    const active = document.activeElement;
    const keep = active && this.element.contains(active) ? active.id : "";
    const { selected } = this.editor;
    let parts;
    if (selected && selected.step !== undefined && this.editor.stepById(selected.step)) {
      parts = this.stepParts(this.editor.stepById(selected.step));
    } else if (selected && selected.edge !== undefined && this.editor.spec.graph.edges[selected.edge]) {
      parts = this.edgeParts(selected.edge);
    } else {
      parts = [
        h("h2", { id: "panel-title", tabindex: "-1", text: "No step selected" }),
        h("p", { class: "muted", text: "Add a step, or choose one in the graph (Tab to it, or click it) to edit it here." }),
      ];
    }
    this.element.replaceChildren(...parts.flat().filter((part) => part !== null && part !== undefined));
    this.showProblems();
    if (keep) {
      const again = document.getElementById(keep);
      if (again) again.focus();
    }
  }

  focusTitle() {
    const title = document.getElementById("panel-title");
    if (title) title.focus();
  }

  /** Writes the selection's messages and marks the fields they name (after validation). */
  showProblems() {
    const list = this.element.querySelector(".panel-problems");
    if (!list) return;
    const { selected } = this.editor;
    const problems = this.editor.problemsOf(selected);
    list.replaceChildren(...problems.map((p) => h("li", { text: p.message })));
    list.hidden = problems.length === 0;
    const named = new Set(problems.map(problemField));
    for (const input of this.element.querySelectorAll("[data-field]")) {
      if (named.has(input.dataset.field)) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
  }

  stepParts(step) {
    const kind = kindOf(step);
    const id = step.step_id;
    const body = step[kind];
    const edit = (change, again = false) => this.editor.update(id, change, { panel: again });
    const stepId = h("input", {
      value: id, autocomplete: "off", spellcheck: "false", maxlength: "64", "data-field": "step_id",
    });
    const idError = h("span", { id: "step-id-error", class: "error", role: "alert", hidden: true });
    stepId.addEventListener("change", () => {
      const wanted = stepId.value.trim();
      const refused = this.editor.renameStep(id, wanted);
      idError.textContent = refused || "";
      idError.hidden = !refused;
      if (refused) stepId.setAttribute("aria-invalid", "true");
    });
    const label = h("input", { value: step.label || "", maxlength: "200", autocomplete: "off" });
    label.addEventListener("input", () => edit((s) => { s.label = label.value; }));
    return [
      h("h2", { id: "panel-title", tabindex: "-1", text: `${KIND_NAMES[kind] || "Step"} step "${id}"` }),
      h("ul", { class: "panel-problems error", "aria-label": "Problems of this step" }),
      field("step-id", "Step id", stepId), idError,
      field("step-label", "Label (shown on the graph)", label),
      ...this.kindFields(kind, step, body, edit),
      ...this.edgeList(step),
      h("button", {
        type: "button", class: "danger", id: "delete-step", text: "Delete step",
        onclick: () => this.editor.deleteStep(id),
      }),
    ];
  }

  kindFields(kind, step, body, edit) {
    const { catalog } = this.editor;
    if (kind === "input") {
      const known = catalog.cameras.map((c) => c.camera_id);
      const all = [...known, ...body.camera_ids.filter((c) => !known.includes(c))];
      const cameras = h("fieldset", { class: "field checks", "data-field": "input.camera_ids" },
        h("legend", { text: "Cameras" }),
        all.length === 0 ? h("p", { class: "muted", text: "No cameras are registered yet." }) : null,
        all.map((cameraId) => {
          const camera = catalog.cameras.find((c) => c.camera_id === cameraId);
          const name = camera ? (camera.name && camera.name !== cameraId ? `${camera.name} (${cameraId})` : cameraId) : `${cameraId} (not registered)`;
          return checkbox(`camera-${cameraId}`, name, body.camera_ids.includes(cameraId), (e) => edit((s) => {
            const ids = s.input.camera_ids.filter((c) => c !== cameraId);
            if (e.target.checked) ids.push(cameraId);
            s.input.camera_ids = all.filter((c) => ids.includes(c));
          }));
        }));
      const day = h("select", { "data-field": "input.day" },
        DAYS.map(([value, text]) => h("option", { value, text, selected: body.day === value })));
      day.addEventListener("change", () => edit((s) => {
        s.input.day = day.value;
        if (day.value === "date") {
          const today = new Date();
          s.input.date = s.input.date || { year: today.getUTCFullYear(), month: today.getUTCMonth() + 1, day: today.getUTCDate() };
        } else delete s.input.date;
      }, true));
      const date = h("input", { type: "date", value: isoDate(body.date), "data-field": "input.date" });
      date.addEventListener("change", () => edit((s) => {
        const [year, month, dd] = date.value.split("-").map(Number);
        if (year) s.input.date = { year, month, day: dd };
        else delete s.input.date;
      }));
      const start = h("input", { type: "time", step: "1", value: clock(body.window_start), "data-field": "input.window_start" });
      const end = h("input", { type: "time", step: "1", value: clock(body.window_end), "data-field": "input.window_end" });
      for (const [input, key] of [[start, "window_start"], [end, "window_end"]]) {
        input.addEventListener("change", () => edit((s) => {
          const value = timeOfDay(input.value);
          if (value) s.input[key] = value;
          else delete s.input[key];
        }));
      }
      return [
        cameras,
        field("step-day", "Day", day),
        body.day === "date" ? field("step-date", "Date", date) : null,
        h("div", { class: "field-row" },
          field("step-window-start", "Daily window from", start),
          field("step-window-end", "to", end, "Local time in the workflow's time zone; 00:00 is the end of the day.")),
      ];
    }
    if (kind === "sample") {
      const interval = h("input", {
        type: "number", min: "0.1", max: "3600", step: "0.1", value: String(body.interval_seconds),
        "data-field": "sample.interval_seconds", inputmode: "decimal",
      });
      interval.addEventListener("input", () => edit((s) => { s.sample.interval_seconds = finite(interval.value); }));
      const keep = checkbox("step-keep", "Keep frames by change (needs a tracking runtime)", !!body.keep_by_change, (e) => edit((s) => {
        if (e.target.checked) s.sample.keep_by_change = { min_displacement: 0 };
        else delete s.sample.keep_by_change;
      }, true), { "data-field": "sample.keep_by_change" });
      return [
        field("step-interval", "Sampling interval (seconds)", interval, "One frame per interval: 0.1 to 3600 seconds."),
        h("div", { class: "field" }, keep),
        body.keep_by_change ? this.displacement("step-keep-min", "sample.keep_by_change", body.keep_by_change, edit, (s) => s.sample.keep_by_change) : null,
      ];
    }
    if (kind === "model") {
      const names = [...new Set(catalog.model_versions.map((v) => v.name))];
      if (body.model_name && !names.includes(body.model_name)) names.push(body.model_name);
      const model = h("select", { "data-field": "model.model_name" },
        body.model_name ? null : h("option", { value: "", text: "Choose a model" }),
        names.map((name) => h("option", { value: name, text: name, selected: name === body.model_name })));
      model.addEventListener("change", () => edit((s) => {
        s.model.model_name = model.value;
        delete s.model.version;
      }, true));
      const versions = catalog.model_versions.filter((v) => v.name === body.model_name);
      const version = h("select", { "data-field": "model.version" },
        h("option", { value: "", text: "latest (resolved when a run is created)", selected: body.version === undefined }),
        versions.map((v) => h("option", {
          value: String(v.version), selected: v.version === body.version,
          text: `v${v.version} (${v.classes.length} classes, published ${v.published_at.slice(0, 10)})`,
        })));
      version.addEventListener("change", () => edit((s) => {
        if (version.value) s.model.version = Number(version.value);
        else delete s.model.version;
      }, true));
      return [field("step-model", "Model", model), field("step-version", "Version", version)];
    }
    if (kind === "rule") {
      const offered = ruleClasses(this.editor.spec, catalog, step.step_id);
      const all = [...offered, ...body.class_names.filter((c) => !offered.includes(c))];
      const classes = h("fieldset", { class: "field checks", "data-field": "rule.class_names" },
        h("legend", { text: "Classes (none checked: any class)" }),
        offered.length === 0 ? h("p", { class: "muted", text: "No model step leads here yet: connect one to choose among its classes." }) : null,
        all.map((name) => checkbox(`class-${name}`, offered.includes(name) ? name : `${name} (no model above has it)`,
          body.class_names.includes(name), (e) => edit((s) => {
            const names = s.rule.class_names.filter((c) => c !== name);
            if (e.target.checked) names.push(name);
            s.rule.class_names = all.filter((c) => names.includes(c));
          }))));
      const score = h("input", {
        type: "number", min: "0", max: "1", step: "0.05", value: String(body.min_score),
        "data-field": "rule.min_score", inputmode: "decimal",
      });
      score.addEventListener("input", () => edit((s) => { s.rule.min_score = finite(score.value); }));
      const motion = checkbox("step-motion", "Only moving objects (needs a tracking runtime)", !!body.motion, (e) => edit((s) => {
        if (e.target.checked) s.rule.motion = { min_displacement: 0 };
        else delete s.rule.motion;
      }, true), { "data-field": "rule.motion" });
      return [
        classes,
        field("step-min-score", "Minimum score", score, "0 to 1; 0 means no minimum."),
        h("div", { class: "field" }, motion),
        body.motion ? this.displacement("step-motion-min", "rule.motion", body.motion, edit, (s) => s.rule.motion) : null,
      ];
    }
    if (kind === "output") {
      const known = catalog.buckets.map((b) => b.bucket_id);
      const bucket = h("select", { "data-field": "output.bucket_id" },
        h("option", { value: "", text: "Choose a bucket", selected: !body.bucket_id }),
        known.map((b) => h("option", { value: b, text: b, selected: b === body.bucket_id })),
        body.bucket_id && !known.includes(body.bucket_id) ? h("option", { value: body.bucket_id, text: `${body.bucket_id} (does not exist)`, selected: true }) : null);
      bucket.addEventListener("change", () => edit((s) => { s.output.bucket_id = bucket.value; }));
      return [field("step-bucket", "Bucket", bucket, "Full runs save the frames routed here into this bucket.")];
    }
    if (kind === "do_nothing") return [h("p", { class: "muted", text: "Frames routed here are dropped (counted as dropped slots)." })];
    return [];
  }

  displacement(id, path, body, edit, get) {
    const input = h("input", {
      type: "number", min: "0", max: "1", step: "0.01", value: String(body.min_displacement),
      "data-field": path, inputmode: "decimal",
    });
    input.addEventListener("input", () => edit((s) => { get(s).min_displacement = finite(input.value); }));
    return field(id, "Minimum displacement", input, "0 to 1 of the frame; 0 means 0.02.");
  }

  edgeList(step) {
    const { spec } = this.editor;
    const id = step.step_id;
    const kind = kindOf(step);
    const describe = (e) => `${e.from_step_id} → ${e.to_step_id}${e.branch === "next" ? "" : ` (${BRANCH_NAMES[e.branch] || e.branch})`}`;
    const rows = [];
    spec.graph.edges.forEach((edge, index) => {
      if (edge.from_step_id !== id && edge.to_step_id !== id) return;
      const problems = this.editor.problemsOf({ edge: index });
      rows.push(h("li", { class: problems.length ? "has-problems" : "" },
        h("span", { text: describe(edge) }),
        problems.map((p) => h("span", { class: "node-problem", text: ` ⚠ ${p.message}` })),
        h("button", {
          type: "button", class: "secondary small", text: "Remove",
          "aria-label": `Remove edge ${describe(edge)}`,
          onclick: () => this.editor.removeEdge(index),
        })));
    });
    const parts = [h("h3", { text: "Edges" }),
      rows.length ? h("ul", { class: "edge-list" }, rows) : h("p", { class: "muted", text: "No edges yet." })];
    const branches = branchesOf(kind);
    const targets = spec.graph.steps.filter((s) => s.step_id !== id && canFollow(kind, kindOf(s)));
    if (branches.length && targets.length) {
      const branch = h("select", { id: "connect-branch" },
        branches.map((b) => h("option", { value: b, text: BRANCH_NAMES[b] })));
      // The first branch without an edge, so a rule's second connection is NO_MATCH.
      const free = branches.find((b) => !spec.graph.edges.some((e) => e.from_step_id === id && e.branch === b));
      if (free) branch.value = free;
      const target = h("select", { id: "connect-to" },
        targets.map((s) => h("option", { value: s.step_id, text: `${s.label || s.step_id} (${KIND_NAMES[kindOf(s)]})` })));
      const connect = h("button", {
        type: "button", id: "connect", text: "Connect",
        onclick: () => {
          if (!hasEdge(spec, id, target.value, branch.value)) this.editor.connect(id, target.value, branch.value);
        },
      });
      parts.push(h("div", { class: "connect" },
        branches.length > 1 ? h("div", { class: "field" }, h("label", { for: "connect-branch", text: "Branch" }), branch) : null,
        h("div", { class: "field" }, h("label", { for: "connect-to", text: "Connect to" }), target),
        connect));
    }
    return parts;
  }

  edgeParts(index) {
    const edge = this.editor.spec.graph.edges[index];
    const name = `${edge.from_step_id} → ${edge.to_step_id}${edge.branch === "next" ? "" : ` (${BRANCH_NAMES[edge.branch] || edge.branch})`}`;
    const go = (stepId) => h("button", {
      type: "button", class: "secondary small", text: `Go to ${stepId}`,
      onclick: () => this.editor.select({ step: stepId }, { focus: "node" }),
      disabled: !this.editor.stepById(stepId),
    });
    return [
      h("h2", { id: "panel-title", tabindex: "-1", text: `Edge ${name}` }),
      h("ul", { class: "panel-problems error", "aria-label": "Problems of this edge" }),
      h("div", { class: "actions" },
        go(edge.from_step_id), go(edge.to_step_id),
        h("button", { type: "button", class: "danger", text: "Remove edge", onclick: () => this.editor.removeEdge(index) })),
    ];
  }
}

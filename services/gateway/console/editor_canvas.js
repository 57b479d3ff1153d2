// The editor's graph: each step a button placed on a canvas, each edge an SVG curve
// beneath them. Steps are moved by dragging or with the arrow keys, deleted with Delete,
// joined by dragging from a step's branch handle onto another step (the side panel does
// the same from the keyboard). Nodes are made once per step id and kept, so a repaint
// never takes the focus away. Validation messages are written on the step, and on the
// edge (a button at its middle) they concern.
import { h, svg } from "./dom.js";
import { BRANCH_NAMES, KIND_NAMES, NODE_WIDTH, branchesOf, clock, kindOf } from "./workflow_graph.js";

const STEP = 10; // px an arrow key moves a step (Shift: 5 times as far)

function summary(step, catalog) {
  const kind = kindOf(step);
  const body = step[kind] || {};
  if (kind === "input") {
    const cams = body.camera_ids.length ? body.camera_ids.join(", ") : "no camera";
    const day = body.day === "date" && body.date ? `${body.date.year}-${String(body.date.month).padStart(2, "0")}-${String(body.date.day).padStart(2, "0")}` : (body.day || "").replace("_", " ");
    return `${cams} · ${day} · ${clock(body.window_start)}–${clock(body.window_end)}`;
  }
  if (kind === "sample") return `every ${body.interval_seconds} s${body.keep_by_change ? " · keep by change" : ""}`;
  if (kind === "model") {
    const known = catalog.model_versions.some((v) => v.name === body.model_name);
    return `${body.model_name || "no model"} ${body.version ? `v${body.version}` : "latest"}${known || !body.model_name ? "" : " (unknown)"}`;
  }
  if (kind === "rule") {
    const classes = body.class_names.length ? body.class_names.join(", ") : "any class";
    return `${classes} ≥ ${body.min_score}${body.motion ? " · moving" : ""}`;
  }
  if (kind === "output") return body.bucket_id ? `into ${body.bucket_id}` : "no bucket";
  if (kind === "do_nothing") return "drops the frame";
  return "no kind";
}

export class Canvas {
  /** `editor`: spec, positions, catalog, selection and the callbacks of editor.js. */
  constructor(editor) {
    this.editor = editor;
    this.nodes = new Map(); // step id -> node element
    this.edges = svg("svg", { class: "edges", "aria-hidden": "true", focusable: "false" });
    this.notes = h("div", { class: "edge-notes" });
    this.board = h("div", {
      class: "board", id: "graph", role: "group", "aria-label": "Workflow graph",
      "aria-describedby": "graph-help",
    }, this.edges, this.notes);
    this.element = h("div", { class: "board-scroll" }, this.board);
    this.board.addEventListener("pointerdown", (event) => this.pointerDown(event));
  }

  /** Paints every step and edge (nodes kept by step id), with their problems. */
  paint() {
    const { spec, catalog } = this.editor;
    const ids = new Set(spec.graph.steps.map((s) => s.step_id));
    for (const [id, node] of this.nodes) {
      if (!ids.has(id)) {
        node.remove();
        this.nodes.delete(id);
      }
    }
    const problems = this.editor.stepProblems();
    for (const step of spec.graph.steps) {
      let node = this.nodes.get(step.step_id);
      if (!node) {
        node = this.makeNode(step.step_id);
        this.nodes.set(step.step_id, node);
        this.board.append(node);
      }
      this.fill(node, step, catalog, problems.get(step.step_id) || []);
    }
    this.board.setAttribute("aria-label",
      `Workflow graph: ${spec.graph.steps.length} steps, ${spec.graph.edges.length} edges`);
    this.drawEdges();
  }

  makeNode(stepId) {
    const node = h("button", { type: "button", class: "node", "data-step-id": stepId });
    node.addEventListener("focus", () => this.editor.select({ step: node.dataset.stepId }, { focus: false }));
    node.addEventListener("click", (event) => {
      if (this.dragged) {
        this.dragged = false;
        return;
      }
      // From the keyboard (Enter, Space), on to the step's panel; a click keeps the focus.
      this.editor.select({ step: node.dataset.stepId }, { focus: event.detail === 0 ? "panel" : false });
    });
    node.addEventListener("keydown", (event) => this.nodeKey(event, node));
    return node;
  }

  fill(node, step, catalog, problems) {
    const kind = kindOf(step);
    node.dataset.stepId = step.step_id;
    node.className = `node kind-${kind || "none"}${problems.length ? " has-problems" : ""}`;
    const selected = this.editor.selected && this.editor.selected.step === step.step_id;
    if (selected) node.setAttribute("aria-current", "true");
    else node.removeAttribute("aria-current");
    const position = this.editor.positions[step.step_id];
    node.style.left = `${position.x}px`;
    node.style.top = `${position.y}px`;
    node.style.width = `${NODE_WIDTH}px`;
    const parts = [
      h("span", { class: "node-kind", text: KIND_NAMES[kind] || "Step without a kind" }),
      h("span", { class: "node-title", text: step.label || step.step_id }),
      h("span", { class: "node-summary", text: summary(step, catalog) }),
    ];
    if (problems.length) {
      parts.push(h("span", { class: "node-problems" },
        problems.map((p) => h("span", { class: "node-problem", text: `⚠ ${p.message}` }))));
    }
    const branches = branchesOf(kind);
    branches.forEach((branch, i) => {
      const port = h("span", {
        class: `port port-${branch}`, "data-branch": branch, "aria-hidden": "true",
        title: `Drag to connect the ${BRANCH_NAMES[branch]} branch`,
      }, branches.length > 1 ? BRANCH_NAMES[branch] : "");
      port.style.top = `${portFraction(branches.length, i) * 100}%`;
      parts.push(port);
    });
    node.replaceChildren(...parts);
  }

  nodeKey(event, node) {
    const id = node.dataset.stepId;
    const moves = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };
    if (moves[event.key]) {
      event.preventDefault();
      const [dx, dy] = moves[event.key];
      const step = event.shiftKey ? STEP * 5 : STEP;
      this.editor.move(id, dx * step, dy * step);
    } else if (event.key === "Delete" || event.key === "Backspace") {
      event.preventDefault();
      this.editor.deleteStep(id);
    }
  }

  /** Places one node again and redraws the edges (a move). */
  place(stepId) {
    const node = this.nodes.get(stepId);
    const position = this.editor.positions[stepId];
    node.style.left = `${position.x}px`;
    node.style.top = `${position.y}px`;
    this.drawEdges();
  }

  focusStep(stepId) {
    const node = this.nodes.get(stepId);
    if (node) node.focus();
  }

  anchor(stepId, side, branch) {
    const node = this.nodes.get(stepId);
    const p = this.editor.positions[stepId];
    if (!node || !p) return null;
    const height = node.offsetHeight || 60;
    if (side === "in") return { x: p.x, y: p.y + height / 2 };
    const branches = branchesOf(kindOf(this.editor.stepById(stepId) || {}));
    const i = Math.max(0, branches.indexOf(branch));
    return { x: p.x + NODE_WIDTH, y: p.y + height * portFraction(branches.length, i) };
  }

  drawEdges() {
    const { spec } = this.editor;
    const problems = this.editor.edgeProblems();
    const paths = [];
    const notes = [];
    let width = 0;
    let height = 0;
    for (const node of this.nodes.values()) {
      const p = this.editor.positions[node.dataset.stepId];
      width = Math.max(width, p.x + NODE_WIDTH + 40);
      height = Math.max(height, p.y + (node.offsetHeight || 60) + 40);
    }
    spec.graph.edges.forEach((edge, index) => {
      const from = this.anchor(edge.from_step_id, "out", edge.branch);
      const to = this.anchor(edge.to_step_id, "in");
      const own = problems.get(index) || [];
      const selected = this.editor.selected && this.editor.selected.edge === index;
      if (!from || !to) return;
      const bend = Math.max(40, Math.abs(to.x - from.x) / 2);
      const d = `M${from.x},${from.y} C${from.x + bend},${from.y} ${to.x - bend},${to.y} ${to.x},${to.y}`;
      const classes = `edge edge-${edge.branch}${own.length ? " edge-problem" : ""}${selected ? " edge-selected" : ""}`;
      paths.push(svg("path", { class: classes, d, "marker-end": "url(#arrow)" }));
      paths.push(svg("path", { class: "edge-hit", d, "data-edge-index": index }));
      const mid = { x: (from.x + to.x) / 2, y: (from.y + to.y) / 2 };
      if (own.length) {
        const note = h("button", {
          type: "button", class: "edge-note", "data-edge-index": index,
          "aria-label": `Edge ${edge.from_step_id} to ${edge.to_step_id}: ${own.map((p) => p.message).join(" ")}`,
          onclick: () => this.editor.select({ edge: index }, { focus: "panel" }),
        }, own.map((p) => h("span", { class: "node-problem", text: `⚠ ${p.message}` })));
        note.style.left = `${mid.x}px`;
        note.style.top = `${mid.y}px`;
        notes.push(note);
      }
    });
    const marker = svg("defs", {}, svg("marker", {
      id: "arrow", viewBox: "0 0 10 10", refX: "10", refY: "5", markerWidth: "8", markerHeight: "8", orient: "auto-start-reverse",
    }, svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow-head" })));
    this.edges.replaceChildren(marker, ...paths);
    this.board.style.width = `${Math.max(width, 320)}px`;
    this.board.style.height = `${Math.max(height, 200)}px`;
    this.edges.setAttribute("width", String(Math.max(width, 320)));
    this.edges.setAttribute("height", String(Math.max(height, 200)));
    this.notes.replaceChildren(...notes);
  }

  // Dragging: a node moves it, a branch handle draws an edge to the step it is dropped on,
  // a click on an edge selects it.
  pointerDown(event) {
    if (event.button !== 0) return;
    const hit = event.target.closest("[data-edge-index]");
    if (hit && hit.classList.contains("edge-hit")) {
      this.editor.select({ edge: Number(hit.dataset.edgeIndex) }, { focus: false });
      return;
    }
    const node = event.target.closest(".node");
    if (!node) return;
    const port = event.target.closest(".port");
    const stepId = node.dataset.stepId;
    const start = { x: event.clientX, y: event.clientY };
    const origin = { ...this.editor.positions[stepId] };
    this.dragged = false;
    let line = null;
    const move = (e) => {
      const dx = e.clientX - start.x;
      const dy = e.clientY - start.y;
      if (!this.dragged && Math.hypot(dx, dy) < 4) return;
      this.dragged = true;
      if (port) {
        const from = this.anchor(stepId, "out", port.dataset.branch);
        const box = this.board.getBoundingClientRect();
        const to = { x: e.clientX - box.left, y: e.clientY - box.top };
        if (!line) {
          line = svg("path", { class: "edge edge-drawing" });
          this.edges.append(line);
        }
        line.setAttribute("d", `M${from.x},${from.y} L${to.x},${to.y}`);
      } else {
        this.editor.moveTo(stepId, { x: Math.max(0, origin.x + dx), y: Math.max(0, origin.y + dy) });
      }
    };
    const up = (e) => {
      window.removeEventListener("pointermove", move);
      window.removeEventListener("pointerup", up);
      if (line) line.remove();
      if (!this.dragged) return;
      // The click that may follow this pointerup is the drag's, not a selection; any later
      // click is a click again.
      window.setTimeout(() => { this.dragged = false; }, 0);
      if (port) {
        const target = document.elementFromPoint(e.clientX, e.clientY);
        const onto = target && target.closest(".node");
        if (onto && onto !== node) this.editor.connect(stepId, onto.dataset.stepId, port.dataset.branch);
      } else {
        this.editor.moved();
      }
    };
    if (port) event.preventDefault(); // no text selection while drawing an edge
    window.addEventListener("pointermove", move);
    window.addEventListener("pointerup", up);
  }
}

function portFraction(count, index) {
  return count <= 1 ? 0.5 : 0.35 + index * 0.35;
}

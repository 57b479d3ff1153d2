// A workflow's graph as the editor handles it: pure functions over the document's JSON
// (proto field names, docs/workflows.md), no DOM. Which steps may follow which, the
// branches each kind has, new steps with their defaults, a first layout, where each
// validation problem belongs, and what changed between two documents.

export const KINDS = ["input", "sample", "model", "rule", "output", "do_nothing"];
export const KIND_NAMES = {
  input: "Input", sample: "Sample", model: "Model", rule: "Rule", output: "Output", do_nothing: "Do nothing",
};
export const BRANCH_NAMES = { next: "next", match: "match", no_match: "no match" };

export function kindOf(step) {
  return KINDS.find((kind) => step[kind] !== undefined && step[kind] !== null) || "";
}

/** The branches a step of `kind` leaves on: rule steps MATCH and NO_MATCH, output and
 * do-nothing none, every other NEXT. */
export function branchesOf(kind) {
  if (kind === "rule") return ["match", "no_match"];
  if (kind === "output" || kind === "do_nothing" || kind === "") return [];
  return ["next"];
}

/** Whether a step of kind `to` may follow one of kind `from` (docs/workflows.md, "Edges
 * and branches"). */
export function canFollow(from, to) {
  if (from === "input") return to === "sample";
  if (from === "sample" || from === "model" || from === "rule") {
    return ["model", "rule", "output", "do_nothing"].includes(to);
  }
  return false;
}

const defaults = {
  input: () => ({
    camera_ids: [], day: "previous_day",
    window_start: { hours: 8, minutes: 0, seconds: 0 }, window_end: { hours: 9, minutes: 0, seconds: 0 },
  }),
  sample: () => ({ interval_seconds: 3 }),
  model: (catalog) => ({ model_name: (catalog.model_versions[0] || {}).name || "" }),
  rule: () => ({ class_names: [], min_score: 0.5 }),
  output: () => ({ bucket_id: "" }),
  do_nothing: () => ({}),
};

/** A free step id for a new step of `kind`: "rule", then "rule-2", "rule-3"... */
export function freeStepId(kind, steps) {
  const base = kind.replace("_", "-");
  const taken = new Set(steps.map((s) => s.step_id));
  if (!taken.has(base)) return base;
  for (let n = 2; ; n++) if (!taken.has(`${base}-${n}`)) return `${base}-${n}`;
}

export function newStep(kind, steps, catalog) {
  return { step_id: freeStepId(kind, steps), label: "", [kind]: defaults[kind](catalog) };
}

export function emptySpec() {
  return { name: "", time_zone: "UTC", graph: { steps: [], edges: [] } };
}

/** The first branch of `from` on which `to` may follow it and that has no edge yet (else
 * the first allowed one); "" when `to` cannot follow `from`. */
export function branchFor(spec, from, to) {
  if (!canFollow(kindOf(from), kindOf(to))) return "";
  const branches = branchesOf(kindOf(from));
  const used = new Set(spec.graph.edges.filter((e) => e.from_step_id === from.step_id).map((e) => e.branch));
  return branches.find((b) => !used.has(b)) || branches[0] || "";
}

export function hasEdge(spec, from, to, branch) {
  return spec.graph.edges.some((e) => e.from_step_id === from && e.to_step_id === to && e.branch === branch);
}

/** Step ids upstream of `stepId` (walking edges backwards). */
export function upstream(spec, stepId) {
  const seen = new Set();
  const queue = [stepId];
  while (queue.length) {
    const id = queue.pop();
    for (const edge of spec.graph.edges) {
      if (edge.to_step_id === id && !seen.has(edge.from_step_id)) {
        seen.add(edge.from_step_id);
        queue.push(edge.from_step_id);
      }
    }
  }
  return seen;
}

/** The class list of a model step's model: the pinned version's, or the latest's. */
export function modelClasses(catalog, model) {
  const versions = catalog.model_versions.filter((v) => v.name === model.model_name);
  if (versions.length === 0) return [];
  const pinned = model.version === undefined || model.version === null
    ? versions.reduce((a, b) => (b.version > a.version ? b : a))
    : versions.find((v) => v.version === model.version);
  return pinned ? pinned.classes : [];
}

/** The classes a rule step may name: those of the model steps upstream of it. */
export function ruleClasses(spec, catalog, stepId) {
  const above = upstream(spec, stepId);
  const classes = [];
  for (const step of spec.graph.steps) {
    if (!above.has(step.step_id) || kindOf(step) !== "model") continue;
    for (const name of modelClasses(catalog, step.model)) if (!classes.includes(name)) classes.push(name);
  }
  return classes;
}

/** Buckets the document's output steps write into, in graph order, once each. */
export function outputBuckets(spec) {
  const ids = [];
  for (const step of spec.graph.steps) {
    if (kindOf(step) === "output" && step.output.bucket_id && !ids.includes(step.output.bucket_id)) {
      ids.push(step.output.bucket_id);
    }
  }
  return ids;
}

export const NODE_WIDTH = 200;
export const COLUMN = 250;
export const ROW = 120;

/** Positions for steps that have none: columns by longest path from the graph's roots,
 * rows in document order within a column. */
export function layout(spec, placed = {}) {
  const depth = {};
  const steps = spec.graph.steps;
  const ids = new Set(steps.map((s) => s.step_id));
  const edges = spec.graph.edges.filter((e) => ids.has(e.from_step_id) && ids.has(e.to_step_id));
  for (const step of steps) depth[step.step_id] = 0;
  // Longest path by relaxation, bounded by the step count (a cycle stops growing there).
  for (let round = 0; round < steps.length; round++) {
    let changed = false;
    for (const edge of edges) {
      const next = depth[edge.from_step_id] + 1;
      if (next > depth[edge.to_step_id] && next < steps.length) {
        depth[edge.to_step_id] = next;
        changed = true;
      }
    }
    if (!changed) break;
  }
  const rows = {};
  const positions = { ...placed };
  for (const step of steps) {
    if (positions[step.step_id]) continue;
    const column = depth[step.step_id];
    const row = rows[column] || 0;
    rows[column] = row + 1;
    positions[step.step_id] = { x: 20 + column * COLUMN, y: 20 + row * ROW };
  }
  return positions;
}

/** A place for a new step: right of `beside` when given, else below everything, moved
 * down until it overlaps no other step. */
export function placeNew(positions, beside) {
  const taken = Object.values(positions);
  let x = beside ? beside.x + COLUMN : 20;
  let y = beside ? beside.y : 20 + Math.max(-1, ...taken.map((p) => Math.round((p.y - 20) / ROW))) * ROW + ROW;
  if (!beside && taken.length === 0) y = 20;
  const clash = () => taken.some((p) => Math.abs(p.x - x) < NODE_WIDTH && Math.abs(p.y - y) < ROW - 20);
  while (clash()) y += ROW;
  return { x: Math.max(0, x), y: Math.max(0, y) };
}

const STEP_PATH = /^graph\.steps\[(\d+)\]/;
const EDGE_PATH = /^graph\.edges\[(\d+)\]/;

/** Where a validation problem belongs: {step: id}, {edge: index} or {document: field}
 * ("name", "time_zone", "schedule", "graph"). `path` may carry the request's "spec."
 * prefix (a 400's field violations). */
export function problemTarget(spec, problem) {
  const path = (problem.path || problem.field || "").replace(/^spec\./, "");
  const edge = EDGE_PATH.exec(path);
  if (edge) return { edge: Number(edge[1]) };
  if (problem.step_id && spec.graph.steps.some((s) => s.step_id === problem.step_id)) {
    return { step: problem.step_id };
  }
  const step = STEP_PATH.exec(path);
  if (step && spec.graph.steps[Number(step[1])]) return { step: spec.graph.steps[Number(step[1])].step_id };
  const field = path.split(/[.[]/)[0];
  return { document: ["name", "time_zone", "schedule"].includes(field) ? field : "graph" };
}

/** The field of a step a problem's path names below the step ("rule.class_names"). */
export function problemField(problem) {
  const path = (problem.path || problem.field || "").replace(/^spec\./, "");
  const rest = path.replace(STEP_PATH, "").replace(/^\./, "");
  return rest.replace(/\[\d+\]/g, "").split(".").slice(0, 2).join(".");
}

function describeStep(step) {
  const kind = kindOf(step);
  return `${KIND_NAMES[kind] || "Step"} "${step.step_id}"`;
}

const edgeKey = (e) => `${e.from_step_id} → ${e.to_step_id} (${BRANCH_NAMES[e.branch] || e.branch})`;

/** What differs between `theirs` (the saved document) and `mine`, as sentences. */
export function differences(theirs, mine) {
  const out = [];
  if (theirs.name !== mine.name) out.push(`Name: theirs "${theirs.name}", yours "${mine.name}".`);
  if ((theirs.time_zone || "UTC") !== (mine.time_zone || "UTC")) {
    out.push(`Time zone: theirs ${theirs.time_zone || "UTC"}, yours ${mine.time_zone || "UTC"}.`);
  }
  const when = (spec) => (spec.schedule ? `daily at ${clock(spec.schedule.time_of_day)}` : "no schedule");
  if (when(theirs) !== when(mine)) out.push(`Schedule: theirs ${when(theirs)}, yours ${when(mine)}.`);
  const theirSteps = new Map(theirs.graph.steps.map((s) => [s.step_id, s]));
  const mySteps = new Map(mine.graph.steps.map((s) => [s.step_id, s]));
  for (const [id, step] of theirSteps) {
    if (!mySteps.has(id)) out.push(`${describeStep(step)}: only in theirs.`);
    else if (JSON.stringify(step) !== JSON.stringify(mySteps.get(id))) {
      out.push(`${describeStep(step)}: changed (theirs ${JSON.stringify(step[kindOf(step)])}, yours ${JSON.stringify(mySteps.get(id)[kindOf(mySteps.get(id))])}).`);
    }
  }
  for (const [id, step] of mySteps) if (!theirSteps.has(id)) out.push(`${describeStep(step)}: only in yours.`);
  const theirEdges = new Set(theirs.graph.edges.map(edgeKey));
  const myEdges = new Set(mine.graph.edges.map(edgeKey));
  for (const key of theirEdges) if (!myEdges.has(key)) out.push(`Edge ${key}: only in theirs.`);
  for (const key of myEdges) if (!theirEdges.has(key)) out.push(`Edge ${key}: only in yours.`);
  return out;
}

/** "08:30" or "08:30:15" from a TimeOfDay. */
export function clock(time) {
  if (!time) return "";
  const pad = (n) => String(n || 0).padStart(2, "0");
  const base = `${pad(time.hours)}:${pad(time.minutes)}`;
  return time.seconds ? `${base}:${pad(time.seconds)}` : base;
}

/** A TimeOfDay from an <input type="time"> value ("08:30" or "08:30:15"); null if empty. */
export function timeOfDay(value) {
  const match = /^(\d{1,2}):(\d{2})(?::(\d{2}))?$/.exec(value || "");
  if (!match) return null;
  return { hours: Number(match[1]), minutes: Number(match[2]), seconds: Number(match[3] || 0) };
}

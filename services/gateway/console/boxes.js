// Detection boxes drawn over an image, each with a label (class and score) that never
// covers another label. Used by the run page's images and their full-size view.
//
// A box is placed as fractions of the frame (percentages of the layer that covers the
// image exactly), so it stays on its object at any size. A label has a fixed size in
// pixels, so where it fits depends on the displayed size: labels are placed in pixels
// after layout, and again whenever the layer is resized (a ResizeObserver, which also
// fires once the image has loaded and given the layer its height).
import { h, placed } from "./dom.js";

const drawn = new WeakMap(); // layer -> { boxes, labels }
const waiting = new Set(); // layers drawn since the last placement
let flushQueued = false;

const resized = new ResizeObserver((entries) => placeAll(entries.map((entry) => entry.target)));

export function labelText(box) {
  return `${box.class_name} ${scoreText(box.score)}`;
}

/** A score with two decimals; "?" for null, the API's answer for a NaN or infinite score
 * that an earlier release stored (requests refuse them now). */
export function scoreText(score) {
  return score === null ? "?" : score.toFixed(2);
}

/** Draws `boxes` (fractions of the frame) into `layer`, replacing what was there. */
export function drawBoxes(layer, boxes) {
  const outlines = boxes.map((box, index) => placed(h("span", { class: "box", "data-box-index": index }), box));
  const labels = boxes.map((box, index) => h("span", {
    class: "box-label", "data-box-index": index, text: labelText(box),
  }));
  layer.replaceChildren(...outlines, ...labels);
  drawn.set(layer, { boxes, labels });
  resized.observe(layer);
  // Placed once this task's DOM writes are done (a paint draws many images), in one
  // read pass and one write pass, before the browser renders.
  waiting.add(layer);
  if (!flushQueued) {
    flushQueued = true;
    queueMicrotask(() => {
      flushQueued = false;
      const layers = [...waiting];
      waiting.clear();
      placeAll(layers);
    });
  }
}

/** Stops following a layer that left the page. */
export function forgetBoxes(layer) {
  resized.unobserve(layer);
  waiting.delete(layer);
  drawn.delete(layer);
}

function placeAll(layers) {
  // Reads first (one layout for all), then writes.
  const plans = [];
  for (const layer of layers) {
    const state = drawn.get(layer);
    if (!state || !layer.isConnected) continue;
    const width = layer.clientWidth;
    const height = layer.clientHeight;
    if (!width || !height) continue; // not laid out yet: the observer calls again
    const sizes = state.labels.map((label) => ({ w: label.offsetWidth, h: label.offsetHeight }));
    const boxes = state.boxes.map((b) => ({ x: b.x * width, y: b.y * height, w: b.w * width, h: b.h * height }));
    plans.push([state.labels, placeLabels(boxes, sizes, width, height)]);
  }
  for (const [labels, spots] of plans) {
    labels.forEach((label, i) => {
      label.style.left = `${spots[i].x}px`;
      label.style.top = `${spots[i].y}px`;
    });
  }
}

function overlaps(a, b) {
  return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

/**
 * Where each box's label goes (its top-left corner, in pixels of a `width`×`height`
 * frame); `boxes` and the labels' `sizes` in pixels. The rule, box by box in order: a
 * label starts at its box's left edge (moved left only as far as it must to stay in the
 * frame) and takes the first of these heights that keeps it inside the frame and clear
 * of every label placed before it: just above the box, just inside the box's top edge,
 * just below the box; then just below or just above one of the labels already placed,
 * nearest to the box's top first. Only when none of those is free (more labels than
 * fit in the frame's height at that place) does it go above the box, overlapping.
 */
export function placeLabels(boxes, sizes, width, height) {
  const placed = [];
  return boxes.map((box, i) => {
    const size = sizes[i];
    const x = Math.max(0, Math.min(box.x, width - size.w));
    const preferred = [box.y - size.h, box.y, box.y + box.h];
    const around = placed.flatMap((p) => [p.y + p.h, p.y - size.h])
      .sort((a, b) => Math.abs(a - preferred[0]) - Math.abs(b - preferred[0]) || a - b);
    const free = (y) => {
      const spot = { x, y, w: size.w, h: size.h };
      return y >= 0 && y + size.h <= height && !placed.some((p) => overlaps(p, spot));
    };
    const y = [...preferred, ...around].find(free);
    const spot = { x, y: y === undefined ? Math.max(0, preferred[0]) : y, w: size.w, h: size.h };
    placed.push(spot);
    return spot;
  });
}

// Building DOM nodes without HTML strings: text is always text (no injection).

export function h(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Replaces the children of `parent` with `children`. */
export function show(parent, ...children) {
  parent.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
}

/** `node` placed over `box` (x, y, w, h: fractions of its frame), in percentages of the
 * layer that covers the frame, so that it stays on its object at any size. */
export function placed(node, box) {
  node.style.left = `${box.x * 100}%`;
  node.style.top = `${box.y * 100}%`;
  node.style.width = `${box.w * 100}%`;
  node.style.height = `${box.h * 100}%`;
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

/** `h` for SVG elements (charts): attributes and text only, in the SVG namespace. */
export function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** A wide table in a box that scrolls sideways on a narrow screen (the page does not): a
 * named region in the tab order, so the keyboard can scroll it too. */
export function scrollBox(label, child) {
  return h("div", { class: "table-scroll", tabindex: "0", role: "region", "aria-label": label }, child);
}

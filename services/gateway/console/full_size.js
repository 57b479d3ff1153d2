// One image shown full size with its boxes, in a modal dialog (the run page opens it
// when an image is clicked). Escape or Close closes it; the focus goes back to what
// opened it.
import { drawBoxes } from "./boxes.js";
import { h } from "./dom.js";

export class FullSize {
  constructor() {
    this.title = h("h2", { id: "full-size-title", class: "full-size-title" });
    this.img = h("img", { alt: "" });
    this.layer = h("span", { class: "boxes" });
    this.frame = h("span", { class: "frame" }, this.img, this.layer);
    const close = h("button", { type: "button", class: "secondary", text: "Close" });
    this.node = h(
      "dialog", { id: "full-size", class: "full-size", "aria-labelledby": "full-size-title" },
      h("div", { class: "full-size-head" }, this.title, close),
      this.frame,
    );
    this.opener = null;
    close.addEventListener("click", () => this.node.close());
    this.node.addEventListener("close", () => {
      if (this.opener && this.opener.isConnected) this.opener.focus();
    });
    // The frame keeps the image's proportions at the largest size the window allows;
    // the boxes layer covers it exactly.
    this.img.addEventListener("load", () => this.fit());
  }

  /** Shows `src` (already loaded by the page, so the browser reuses it) with `boxes`. */
  open({ src, alt, title, boxes, opener }) {
    this.opener = opener;
    this.title.textContent = title;
    this.img.alt = alt;
    if (this.img.getAttribute("src") !== src) this.img.src = src;
    this.fit();
    if (!this.node.open) this.node.showModal();
    drawBoxes(this.layer, boxes);
  }

  fit() {
    const { naturalWidth: width, naturalHeight: height } = this.img;
    if (width && height) this.frame.style.setProperty("--ratio", String(width / height));
  }
}

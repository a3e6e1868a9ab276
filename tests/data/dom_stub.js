// A minimal DOM for running servesim's report charts under node (no browser here): elements with
// attributes, children, listeners and text; enough for plots/assets/charts.js. Reads the page's chart
// blocks from stdin as JSON {specs: {id: spec}, script: "..."}, drives each chart (hover, drag-zoom,
// double-click, legend click) and prints what was drawn as JSON.
"use strict";
class El {
  constructor(tag) { this.tag = tag; this.attrs = {}; this.children = []; this.listeners = {}; this.style = {};
                     this._text = ""; this.className = ""; this.onclick = null; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  getAttribute(k) { return this.attrs[k]; }
  appendChild(c) { this.children.push(c); return c; }
  addEventListener(type, fn) { this.listeners[type] = fn; }
  set innerHTML(v) { this.children = []; this._html = v; }
  get innerHTML() { return this._html || ""; }
  set textContent(v) { this._text = String(v); }
  get textContent() { return this._text; }
  getBoundingClientRect() { return {left: 0, top: 0}; }
  all(tag) { const out = []; const walk = (e) => { if (e.tag === tag) out.push(e); (e.children || []).forEach(walk); };
             walk(this); return out; }
}
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const divs = Object.keys(input.specs).map((id) => { const d = new El("div"); d.id = id; d.clientWidth = 800;
                                                     d.setAttribute("data-spec", id + "-data"); return d; });
global.document = {
  createElementNS: (ns, tag) => new El(tag), createElement: (tag) => new El(tag),
  createTextNode: (t) => { const e = new El("#text"); e.textContent = t; return e; },
  querySelectorAll: () => divs,
  getElementById: (id) => ({textContent: JSON.stringify(input.specs[id.replace(/-data$/, "")])}),
};
eval(input.script);
const report = {};
for (const d of divs) {
  const svg = d.all("svg")[0];
  const before = d.all("path").length;
  svg.listeners.mousemove({clientX: 400});
  const tip = d.children.find((c) => c.className === "sstip").textContent;
  svg.listeners.mousedown({clientX: 100, preventDefault() {}});
  svg.listeners.mouseup({clientX: 300});
  const zoomedTicks = d.all("svg")[0].all("text").map((t) => t.textContent);
  d.all("svg")[0].listeners.dblclick();
  const legend = d.children.find((c) => c.className === "sslegend");
  legend.children[0].onclick();
  const afterHide = d.all("path").length;
  report[d.id] = {paths: before, tip, zoomedTicks, afterHide, title: d.all("svg")[0].all("text")[0].textContent};
}
console.log(JSON.stringify(report));

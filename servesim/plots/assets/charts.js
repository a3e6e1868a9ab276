// servesim's interactive report charts: inline SVG, no library, no network. Each <div class="sschart">
// names a <script type="application/json"> holding {title, xlabel, ylabel, step, series: [{name, color,
// x: [...], y: [...]}]}. Hover: the value of every shown series at that x. Drag: zoom into an x range.
// Double-click: back to the whole range. Click a legend entry: hide or show that series.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  function el(tag, attrs, parent) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function ticks(lo, hi, n) {
    var span = hi - lo || 1, raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var step = [1, 2, 5, 10].map(function (f) { return f * mag; }).filter(function (s) { return span / s <= n; })[0] || raw;
    var out = [];
    for (var v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }
  function fmt(v) {
    var a = Math.abs(v);
    return (a >= 1e5 || (a < 1e-3 && a > 0)) ? v.toExponential(2) : String(+v.toPrecision(4));
  }
  function nearest(xs, x) {  // index of the last xs[i] <= x (xs ascending), clamped
    var lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (lo < hi) { var mid = (lo + hi + 1) >> 1; if (xs[mid] <= x) lo = mid; else hi = mid - 1; }
    return lo;
  }
  function chart(div, spec) {
    var hidden = {}, xr = null, W = Math.max(div.clientWidth || 0, 480), H = 300;
    var m = {l: 64, r: 12, t: 26, b: 42};
    function shown() { return spec.series.filter(function (s) { return !hidden[s.name] && s.x.length; }); }
    function render() {
      div.innerHTML = "";
      var ss = shown(), xs = [], ys = [];
      ss.forEach(function (s) {
        s.x.forEach(function (x, i) { if (!xr || (x >= xr[0] && x <= xr[1])) { xs.push(x); ys.push(s.y[i]); } });
      });
      var x0 = xr ? xr[0] : Math.min.apply(null, xs.length ? xs : [0]), x1 = xr ? xr[1] : Math.max.apply(null, xs.length ? xs : [1]);
      var y0 = Math.min(0, Math.min.apply(null, ys.length ? ys : [0])), y1 = Math.max.apply(null, ys.length ? ys : [1]);
      if (x1 <= x0) x1 = x0 + 1;
      if (y1 <= y0) y1 = y0 + 1;
      var px = function (x) { return m.l + (x - x0) / (x1 - x0) * (W - m.l - m.r); };
      var py = function (y) { return H - m.b - (y - y0) / (y1 - y0) * (H - m.t - m.b); };
      var svg = el("svg", {width: W, height: H, viewBox: "0 0 " + W + " " + H, "font-size": 11}, div);
      el("text", {x: W / 2, y: 15, "text-anchor": "middle", "font-weight": "bold"}, svg).textContent = spec.title;
      ticks(x0, x1, 8).forEach(function (t) {
        el("line", {x1: px(t), x2: px(t), y1: m.t, y2: H - m.b, stroke: "#eee"}, svg);
        el("text", {x: px(t), y: H - m.b + 14, "text-anchor": "middle"}, svg).textContent = fmt(t);
      });
      ticks(y0, y1, 5).forEach(function (t) {
        el("line", {x1: m.l, x2: W - m.r, y1: py(t), y2: py(t), stroke: "#eee"}, svg);
        el("text", {x: m.l - 4, y: py(t) + 4, "text-anchor": "end"}, svg).textContent = fmt(t);
      });
      el("text", {x: W / 2, y: H - 6, "text-anchor": "middle"}, svg).textContent = spec.xlabel;
      el("text", {x: 12, y: H / 2, "text-anchor": "middle", transform: "rotate(-90 12 " + H / 2 + ")"}, svg)
        .textContent = spec.ylabel;
      el("clipPath", {id: div.id + "-clip"}, svg).appendChild(
        el("rect", {x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b}));
      ss.forEach(function (s) {
        var d = "";
        s.x.forEach(function (x, i) {
          var X = px(x).toFixed(1), Y = py(s.y[i]).toFixed(1);
          d += i === 0 ? "M" + X + "," + Y : (spec.step ? "H" + X + "V" + Y : "L" + X + "," + Y);
        });
        el("path", {d: d, fill: "none", stroke: s.color, "stroke-width": 1.6, "clip-path": "url(#" + div.id + "-clip)"}, svg);
      });
      var cursor = el("line", {y1: m.t, y2: H - m.b, stroke: "#888", visibility: "hidden"}, svg);
      var band = el("rect", {y: m.t, height: H - m.t - m.b, fill: "rgba(0,114,178,0.15)", visibility: "hidden"}, svg);
      var tip = document.createElement("div");
      tip.className = "sstip";
      div.appendChild(tip);
      var legend = document.createElement("div");
      legend.className = "sslegend";
      spec.series.forEach(function (s) {
        var item = document.createElement("span");
        item.innerHTML = "<i style='background:" + s.color + "'></i>";
        item.appendChild(document.createTextNode(s.name));
        if (hidden[s.name]) item.className = "off";
        item.onclick = function () { hidden[s.name] = !hidden[s.name]; render(); };
        legend.appendChild(item);
      });
      div.appendChild(legend);
      var start = null;
      var toX = function (ev) { var r = svg.getBoundingClientRect(); return ev.clientX - r.left; };
      svg.addEventListener("mousemove", function (ev) {
        var X = toX(ev), x = x0 + (X - m.l) / (W - m.l - m.r) * (x1 - x0);
        cursor.setAttribute("x1", X); cursor.setAttribute("x2", X); cursor.setAttribute("visibility", "visible");
        var rows = [spec.xlabel + ": " + fmt(x)];
        shown().forEach(function (s) { var i = nearest(s.x, x); if (i >= 0) rows.push(s.name + ": " + fmt(s.y[i])); });
        tip.textContent = rows.join("\n");
        tip.style.left = Math.min(X + 12, W - 180) + "px";
        tip.style.display = "block";
        if (start !== null) {
          band.setAttribute("x", Math.min(start, X)); band.setAttribute("width", Math.abs(X - start));
          band.setAttribute("visibility", "visible");
        }
      });
      svg.addEventListener("mouseleave", function () { tip.style.display = "none"; cursor.setAttribute("visibility", "hidden"); });
      svg.addEventListener("mousedown", function (ev) { start = toX(ev); ev.preventDefault(); });
      svg.addEventListener("mouseup", function (ev) {
        var X = toX(ev);
        if (start !== null && Math.abs(X - start) > 4) {
          var a = x0 + (Math.min(start, X) - m.l) / (W - m.l - m.r) * (x1 - x0);
          var b = x0 + (Math.max(start, X) - m.l) / (W - m.l - m.r) * (x1 - x0);
          xr = [a, b];
          start = null;
          render();
          return;
        }
        start = null;
        band.setAttribute("visibility", "hidden");
      });
      svg.addEventListener("dblclick", function () { xr = null; render(); });
    }
    render();
  }
  var divs = document.querySelectorAll("div.sschart");
  for (var i = 0; i < divs.length; i++) {
    chart(divs[i], JSON.parse(document.getElementById(divs[i].getAttribute("data-spec")).textContent));
  }
})();

// fairstream's small line-chart library: one SVG chart of named series, no dependencies.
// drawLines(svg, series, options): series is {name: [[x, y], ...]}; options: {title, yLabel,
// xFormat(x) -> text, marks: [{x, label}] (dashed vertical lines, e.g. preemptions)}. Redraws the
// whole SVG each call.
"use strict";

const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf"];

function svgNode(name, attributes, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", name);
  for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawLines(svg, series, options) {
  options = options || {};
  const width = svg.clientWidth || 560, height = svg.clientHeight || 260;
  const left = 56, right = 120, top = 24, bottom = 28;
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.appendChild(svgNode("text", {x: left, y: 14, "font-size": 13, "font-weight": "bold"}, options.title || ""));
  const names = Object.keys(series).sort();
  const points = names.flatMap((name) => series[name]);
  if (!points.length) {
    svg.appendChild(svgNode("text", {x: left, y: height / 2, fill: "#777"}, "no samples yet"));
    return;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs) === x0 ? x0 + 1 : Math.max(...xs);
  const y1 = Math.max(...ys) > 0 ? Math.max(...ys) * 1.05 : 1;
  const sx = (x) => left + (x - x0) / (x1 - x0) * (width - left - right);
  const sy = (y) => height - bottom - y / y1 * (height - top - bottom);
  svg.appendChild(svgNode("line", {x1: left, y1: sy(0), x2: width - right, y2: sy(0), stroke: "#999"}));
  svg.appendChild(svgNode("line", {x1: left, y1: top, x2: left, y2: sy(0), stroke: "#999"}));
  for (let k = 0; k <= 4; k++) {
    const y = y1 * k / 4;
    svg.appendChild(svgNode("text", {x: left - 6, y: sy(y) + 4, "font-size": 10, "text-anchor": "end"},
                            y.toPrecision(3)));
  }
  const format = options.xFormat || ((x) => x.toFixed(0));
  svg.appendChild(svgNode("text", {x: left, y: height - 8, "font-size": 10}, format(x0)));
  svg.appendChild(svgNode("text", {x: width - right, y: height - 8, "font-size": 10, "text-anchor": "end"}, format(x1)));
  if (options.yLabel) {
    svg.appendChild(svgNode("text", {x: 12, y: top + 10, "font-size": 10, transform: `rotate(-90 12 ${top + 10})`,
                                     "text-anchor": "end"}, options.yLabel));
  }
  for (const mark of options.marks || []) {
    if (mark.x < x0 || mark.x > x1) continue;
    const x = sx(mark.x).toFixed(1);
    const line = svgNode("line", {x1: x, y1: top, x2: x, y2: sy(0), stroke: "#d62728", "stroke-dasharray": "3 3",
                                  "stroke-width": 1, class: "mark"});
    line.appendChild(svgNode("title", {}, mark.label || ""));
    svg.appendChild(line);
  }
  names.slice(0, PALETTE.length).forEach((name, k) => {
    const colour = PALETTE[k];
    const path = series[name].map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    svg.appendChild(svgNode("polyline", {points: path, fill: "none", stroke: colour, "stroke-width": 1.6,
                                         "data-series": name}));
    svg.appendChild(svgNode("text", {x: width - right + 8, y: top + 14 * k + 8, "font-size": 11, fill: colour}, name));
  });
  if (names.length > PALETTE.length) {
    svg.appendChild(svgNode("text", {x: width - right + 8, y: top + 14 * PALETTE.length + 8, "font-size": 10,
                                     fill: "#777"}, `+${names.length - PALETTE.length} more`));
  }
}

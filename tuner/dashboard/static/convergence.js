// The convergence chart of a job, drawn with uPlot from tuner/report/series.py's columns.
// One script for the dashboard (served) and `tuner report` (inlined), so both draw the same plot.
(function (global) {
  "use strict";
  var BEST = "#d9480f", TRIAL = "#1c7ed6", FAILED = "#868e96", HISTORY = "#495057";

  // GFLOPS with about three significant digits, whatever their scale.
  function gflops(v) {
    if (v === null || v === undefined) return "-";
    return v >= 100 ? v.toFixed(1) : v >= 1 ? v.toFixed(2) : v.toPrecision(3);
  }

  function columns(series, by) {
    var x = by === "seconds" ? series.seconds : series.trial;
    var out = [x, series.gflops, series.best, series.failed];
    if (series.earlier_best !== null) out.push(series.trial.map(function () { return series.earlier_best; }));
    return out;
  }

  function options(series, by, width) {
    return {
      width: width, height: 300,
      legend: { live: true },
      cursor: { drag: { x: true, y: false } },
      scales: { x: { time: false }, y: { range: function (u, lo, hi) { return [0, (hi || 1) * 1.12]; } } },
      axes: [
        { label: by === "seconds" ? "seconds since the job started" : "trial number (this job)" },
        { label: "GFLOPS", size: 60, values: function (u, splits) { return splits.map(gflops); } },
      ],
      series: [
        { label: by === "seconds" ? "s" : "trial" },
        { label: "trial GFLOPS", value: function (u, v) { return gflops(v); }, stroke: TRIAL, width: 0, points: { show: true, size: 5, fill: TRIAL, stroke: TRIAL } },
        { label: "best so far", value: function (u, v) { return gflops(v); }, stroke: BEST, width: 2, paths: uPlot.paths.stepped({ align: 1 }), points: { show: false } },
        { label: "failed", stroke: FAILED, width: 0, points: { show: true, size: 6, fill: FAILED, stroke: FAILED } },
      ].concat(series.earlier_best === null ? [] : [
        { label: "best of " + series.earlier_trials + " earlier trials", stroke: HISTORY, width: 1, dash: [6, 4],
          points: { show: false } },
      ]),
    };
  }

  // Draw into `element`; returns the chart (call .update(series) with new columns).
  function convergence(element, series, by, width) {
    var w = width || element.clientWidth || 640;
    var chart = new uPlot(options(series, by, w), columns(series, by), element);
    return {
      chart: chart,
      update: function (next) { chart.setData(columns(next, by)); },
      points: function () { return chart.data[0].length; },
    };
  }

  global.tunefleetConvergence = convergence;
  global.tunefleetGflops = gflops;
})(typeof window !== "undefined" ? window : this);

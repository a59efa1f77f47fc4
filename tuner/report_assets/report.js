// Draws a spec-tuner job report's charts from its JSON block with uPlot (inlined beside this file).
// Each chart's plotted arrays are kept on window.reportCharts[id] = {series, data, low, high}, so a test can
// compare what is drawn with the job's trials.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var charts = {};
  window.reportCharts = charts;
  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22"];

  function colour(i) { return PALETTE[i % PALETTE.length]; }

  function chartWidth() { return Math.max(320, Math.min(620, document.documentElement.clientWidth - 48)); }

  // Align series of [x, y] points on one sorted x axis, duplicates kept (two runs at the same x are two
  // entries): each series has its y at its own entries and null elsewhere. extras: parallel arrays per point.
  function align(series, extras) {
    var entries = [];
    series.forEach(function (s, si) {
      s.points.forEach(function (p, pi) { entries.push({x: p[0], y: p[1], s: si, p: pi}); });
    });
    entries.sort(function (a, b) { return a.x - b.x || a.s - b.s; });
    var out = [entries.map(function (e) { return e.x; })];
    var extra = {};
    (extras || []).forEach(function (name) { extra[name] = []; });
    series.forEach(function (s, si) {
      out.push(entries.map(function (e) { return e.s === si ? e.y : null; }));
      (extras || []).forEach(function (name) {
        extra[name].push(entries.map(function (e) {
          return e.s === si && s[name] ? s[name][e.p] : null;
        }));
      });
    });
    return {data: out, extra: extra};
  }

  // Vertical bars from low to high at each point (the spread of a configuration's runs).
  function errorBars(low, high) {
    return function (u) {
      var ctx = u.ctx;
      ctx.save();
      for (var si = 1; si < u.series.length; si++) {
        if (!u.series[si].show || !low[si - 1]) continue;
        ctx.strokeStyle = u.series[si]._stroke || "#333";
        ctx.lineWidth = 1.5 * devicePixelRatio;
        for (var i = 0; i < u.data[0].length; i++) {
          var lo = low[si - 1][i], hi = high[si - 1][i];
          if (lo == null || hi == null || lo === hi) continue;
          var x = u.valToPos(u.data[0][i], "x", true);
          var y0 = u.valToPos(lo, u.series[si].scale, true), y1 = u.valToPos(hi, u.series[si].scale, true);
          var w = 4 * devicePixelRatio;
          ctx.beginPath();
          ctx.moveTo(x, y0); ctx.lineTo(x, y1);
          ctx.moveTo(x - w, y0); ctx.lineTo(x + w, y0);
          ctx.moveTo(x - w, y1); ctx.lineTo(x + w, y1);
          ctx.stroke();
        }
      }
      ctx.restore();
    };
  }

  // A dashed line at a value of one axis: the no-speculation line, an SLO.
  function rule(axis, value, label) {
    return function (u) {
      if (value == null) return;
      var ctx = u.ctx, b = u.bbox;
      ctx.save();
      ctx.strokeStyle = "#b00";
      ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
      ctx.lineWidth = devicePixelRatio;
      ctx.beginPath();
      if (axis === "x") {
        var x = u.valToPos(value, "x", true);
        ctx.moveTo(x, b.top); ctx.lineTo(x, b.top + b.height);
      } else {
        var y = u.valToPos(value, "y", true);
        ctx.moveTo(b.left, y); ctx.lineTo(b.left + b.width, y);
      }
      ctx.stroke();
      ctx.fillStyle = "#b00";
      ctx.font = 11 * devicePixelRatio + "px sans-serif";
      ctx.fillText(label, (axis === "x" ? u.valToPos(value, "x", true) : b.left) + 4, b.top + 12 * devicePixelRatio);
      ctx.restore();
    };
  }

  function draw(id, spec) {
    var el = document.getElementById(id);
    if (!el) return;
    if (!spec.series.length) {
      el.insertAdjacentHTML("beforeend", '<p class="empty">No figures for this chart.</p>');
      charts[id] = {series: [], data: [[]], low: [], high: []};
      return;
    }
    var aligned = align(spec.series, ["low", "high"]);
    var seriesOpts = [{label: spec.xLabel}].concat(spec.series.map(function (s, i) {
      var c = colour(i);
      var o = {
        label: s.name,
        stroke: c,
        width: s.line === false ? 0 : 2,
        spanGaps: true,
        dash: s.dashed ? [6, 4] : undefined,
        points: {show: true, size: 7, stroke: c, fill: s.hollow ? "#fff" : c},
      };
      if (s.line === false) o.paths = function () { return null; };
      if (s.stepped) o.paths = uPlot.paths.stepped({align: 1});
      return o;
    }));
    var hooks = [];
    if (spec.bars) hooks.push(errorBars(aligned.extra.low, aligned.extra.high));
    (spec.rules || []).forEach(function (r) { hooks.push(rule(r.axis, r.value, r.label)); });
    var opts = {
      width: chartWidth(),
      height: 300,
      scales: {x: {time: false, distr: spec.logX ? 3 : 1}, y: {auto: true}},
      axes: [{label: spec.xLabel}, {label: spec.yLabel}],
      series: seriesOpts,
      hooks: {draw: hooks},
      legend: {live: true},
    };
    var u = new uPlot(opts, aligned.data, el);
    charts[id] = {series: spec.series.map(function (s) { return s.name; }), data: u.data,
      low: aligned.extra.low, high: aligned.extra.high};
  }

  var xKind = data.levels.length && data.levels[0].kind === "rate" ? "request rate (req/s)" : "concurrency";

  // 1. Speedup by concurrency: measured configurations, the no-speculation line, predictions apart.
  draw("chart-speedup", {
    xLabel: xKind, yLabel: "speedup over off", logX: true, bars: true,
    rules: [{axis: "y", value: 1, label: "off"}],
    series: data.speedup.map(function (s) {
      return {
        name: (s.kind === "predicted" ? "predicted: " : "") + s.name,
        points: s.points.map(function (p) { return [p.value, p.speedup]; }),
        low: s.points.map(function (p) { return p.low == null ? null : p.low; }),
        high: s.points.map(function (p) { return p.high == null ? null : p.high; }),
        dashed: s.kind === "predicted", hollow: s.kind === "predicted",
      };
    }),
  });

  // 2. K by batch size: the deployed configuration as a step, the per-range answers as points.
  var deployed = data.answer.deployed;
  var schedule = [];
  if (deployed && deployed.steps && deployed.steps.length) {
    schedule.push({name: "deployed: " + deployed.label, stepped: true,
      points: deployed.steps.map(function (s) { return [s.batch_size, s.k]; })});
  }
  if (data.answer.ranges.length) {
    var top = Math.max.apply(null, data.levels.map(function (lv) { return lv.value || 1; }).concat([1]));
    var pts = [];
    data.answer.ranges.forEach(function (r) {
      pts.push([r.low, r.k]);
      pts.push([r.high == null ? Math.max(top, r.low) : r.high, r.k]);
    });
    schedule.push({name: "per-range answers", line: false, points: pts});
  }
  draw("chart-schedule", {xLabel: "batch size (running requests)", yLabel: "K (draft tokens)", logX: true,
    series: schedule});

  // 3. Acceptance per draft position, cumulative and conditional.
  ["cumulative", "conditional"].forEach(function (kind) {
    draw(kind === "cumulative" ? "chart-accept-cum" : "chart-accept-cond", {
      xLabel: "draft position", yLabel: "acceptance",
      series: data.acceptance.map(function (a) {
        return {name: a.name, points: a[kind].map(function (v, i) { return [i + 1, v]; })};
      }),
    });
  });

  // 4. Throughput against p99 TPOT and TTFT: a point per trial and level, a series per configuration.
  function pareto(id, field, slo, sloLabel) {
    var byConfig = {};
    var order = [];
    data.trials.forEach(function (t) {
      t.levels.forEach(function (lv) {
        if (!(t.label in byConfig)) { byConfig[t.label] = []; order.push(t.label); }
        byConfig[t.label].push([lv[field], lv.output_throughput]);
      });
    });
    draw(id, {
      xLabel: field.replace(/_/g, " "), yLabel: "output tokens/s",
      rules: slo == null ? [] : [{axis: "x", value: slo, label: sloLabel}],
      series: order.map(function (name) { return {name: name, line: false, points: byConfig[name]}; }),
    });
  }
  pareto("chart-pareto-tpot", "tpot_p99_ms", data.job.slo && data.job.slo.p99_tpot_ms, "SLO p99 TPOT");
  pareto("chart-pareto-ttft", "ttft_p99_ms", data.job.slo && data.job.slo.p99_ttft_ms, "SLO p99 TTFT");
})();

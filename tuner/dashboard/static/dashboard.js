// The dashboard's front end: each page renders the JSON its API answers (the server put the first
// answer in #page-data) and live pages poll that API again. DOM is built with textContent only.
(function () {
  "use strict";
  var app = document.getElementById("app");
  var page = app.dataset.page;
  var refreshMs = parseInt(app.dataset.refresh, 10) || 1500;
  var charts = {};

  // -- helpers -------------------------------------------------------------------------------
  function h(tag, attrs, children) {
    var el = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") el.textContent = attrs[k];
      else if (k === "cls") el.className = attrs[k];
      else if (attrs[k] !== null && attrs[k] !== undefined) el.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    });
    return el;
  }
  function fill(id, node) { var el = document.getElementById(id); if (el) { el.replaceChildren(node); } }
  function table(head, rows, opts) {
    opts = opts || {};
    if (!rows.length) return h("p", { cls: "empty", text: opts.empty || "nothing yet" });
    var thead = h("tr", {}, head.map(function (c) {
      return h("th", { cls: c.num ? "num" : null, text: c.label || c });
    }));
    return h("table", { id: opts.id || null }, [h("thead", {}, [thead]), h("tbody", {}, rows.map(function (r) {
      return h("tr", { "data-status": r.status || null }, r.cells.map(function (c, i) {
        var cell = c instanceof Node ? c : document.createTextNode(c === null || c === undefined ? "-" : String(c));
        return h("td", { cls: head[i].num ? "num" : null }, [cell]);
      }));
    }))]);
  }
  function kv(pairs) {
    return h("table", { cls: "kv" }, pairs.map(function (p) {
      return h("tr", {}, [h("th", { text: p[0] }), h("td", {}, [p[1] instanceof Node ? p[1] : String(p[1])])]);
    }));
  }
  function cards(items) {
    return h("div", { cls: "cards" }, items.map(function (c) {
      return h("div", { cls: "card", "data-card": c[0] }, [h("div", { cls: "label", text: c[0] }),
                                                             h("div", { cls: "value", text: c[1] })]);
    }));
  }
  function state(s) { return h("span", { cls: "state " + s, text: s }); }
  function ms(s) {
    if (s === null || s === undefined) return "-";
    if (s < 1e-3) return (s * 1e6).toFixed(2) + " µs";
    return s < 10 ? (s * 1e3).toPrecision(4) + " ms" : s.toPrecision(3) + " s";
  }
  function num(v, digits) { return v === null || v === undefined ? "-" : Number(v).toFixed(digits === undefined ? 2 : digits); }
  function gf(v) { return window.tunefleetGflops(v); }
  function json(v) { return JSON.stringify(v); }
  function when(iso) { return iso ? iso.replace("T", " ").slice(0, 19) : "-"; }
  function link(href, text) { return h("a", { href: href, text: text }); }
  function jobLink(id) { return link("/jobs/" + id, "#" + id); }
  function workloadLink(key) { return link("/workload?key=" + encodeURIComponent(key), key); }
  function code(v) { return h("code", { text: typeof v === "string" ? v : json(v) }); }

  function apiUrl() {
    var path = location.pathname, q = location.search;
    if (page === "overview") return "/api/overview";
    if (page === "job") return "/api" + path;
    if (page === "agents") return "/api/agents";
    return "/api/" + page + q;
  }
  function liveDot(ok) { var d = document.getElementById("live-dot"); if (d) d.className = "dot " + (ok ? "on" : "off"); }

  // -- overview ------------------------------------------------------------------------------
  function overview(d) {
    var states = d.jobs_by_state;
    fill("overview-cards", cards([
      ["running", (states.running || 0) + (states.queued || 0)], ["done", states.done || 0],
      ["failed", states.failed || 0], ["cancelled", states.cancelled || 0],
      ["trials / s", num(d.trials_per_second)], ["device keys", d.keys.length],
    ]));
    fill("keys", table([{ label: "key" }, { label: "health" }, { label: "agents", num: 1 }, { label: "busy", num: 1 },
                        { label: "queued", num: 1 }, { label: "jobs", num: 1 }],
      d.keys.map(function (k) {
        return { cells: [k.key, state(k.health), k.agents, k.busy_agents,
                         k.queued_candidates, k.jobs] };
      }), { empty: "no device key yet" }));
    fill("errors", table([{ label: "when" }, { label: "job" }, { label: "status" }, { label: "message" }],
      d.recent_errors.map(function (t) {
        return { cells: [when(t.created_at), t.job_id ? jobLink(t.job_id) : "-", h("span", { cls: "status-err", text: t.status }),
                         h("span", { cls: "msg", text: t.message || "-" })] };
      }), { empty: "no failed trial" }));
    fill("jobs", jobsTable(d.jobs));
  }
  function jobsTable(jobs) {
    return table([{ label: "job" }, { label: "state" }, { label: "workload" }, { label: "device key" },
                  { label: "strategy" }, { label: "trials", num: 1 }, { label: "failed", num: 1 },
                  { label: "best GFLOPS", num: 1 }, { label: "created" }],
      jobs.map(function (j) {
        return { cells: [jobLink(j.job_id), state(j.state), workloadLink(j.workload), j.device_key, j.strategy,
                         j.trials + " / " + j.budget, j.failed, gf(j.best_gflops), when(j.created_at)] };
      }), { id: "jobs-table", empty: "no job yet: tuner tune or tuner submit starts one" });
  }

  // -- job -----------------------------------------------------------------------------------
  var trialFilter = "";
  function job(d) {
    document.getElementById("job-title").replaceChildren("Job " + d.job_id + ": ", h("span", { cls: "mono", text: d.workload }),
                                                         " ", state(d.state));
    fill("job-sub", document.createTextNode("on " + d.device_key + " (target " + d.target + "), strategy " + d.strategy +
         ", created " + when(d.created_at) + (d.message ? " · " + d.message : "")));
    var best = d.top.length ? d.top[0] : null;
    fill("job-cards", cards([
      ["trials", d.trials + " / " + d.budget], ["ok", d.ok_trials], ["failed", d.failed],
      ["best GFLOPS", best ? gf(best.gflops) : "-"], ["best time", best ? ms(best.mean_s) : "-"],
      ["vs default", best && d.default_mean_s ? num(d.default_mean_s / best.mean_s) + "x" : "-"],
    ]));
    actions(d);
    drawChart("chart-trials", d.series, "trial");
    drawChart("chart-time", d.series, "seconds");
    fill("top", table([{ label: "#", num: 1 }, { label: "trial", num: 1 }, { label: "time", num: 1 },
                       { label: "GFLOPS", num: 1 }, { label: "config" }, { label: "diff from default" }, { label: "kernel" }],
      d.top.map(function (t) {
        return { cells: [t.rank, t.trial, ms(t.mean_s), gf(t.gflops), code(t.config), diff(t), kernelLink(d, t.config)] };
      }), { empty: "no trial of this job ran successfully yet" }));
    fill("status-counts", table([{ label: "status" }, { label: "trials", num: 1 }, { label: "sample message" }],
      d.status_counts.map(function (c) {
        return { cells: [h("span", { cls: c.status === "ok" ? "status-ok" : "status-err", text: c.status }), c.count,
                         h("span", { cls: "msg", text: c.sample_message || "-" })] };
      })));
    fill("spec", kv(Object.keys(d.spec).map(function (k) { return [k, code(d.spec[k])]; })));
    var select = document.getElementById("status-filter");
    var known = Array.prototype.map.call(select.options, function (o) { return o.value; });
    d.status_counts.forEach(function (c) {
      if (known.indexOf(c.status) < 0) select.appendChild(h("option", { value: c.status, text: c.status }));
    });
    loadTrials(d.job_id);
  }
  function diff(t) {
    if (t.is_default) return h("span", { cls: "tag", text: "default" });
    if (!t.diff_from_default) return "-";
    return h("span", { cls: "diff" }, Object.keys(t.diff_from_default).map(function (k) {
      var pair = t.diff_from_default[k];
      return h("div", {}, [k + ": ", h("del", { text: json(pair[0]) }), " → ", h("ins", { text: json(pair[1]) })]);
    }));
  }
  function kernelLink(d, config) {
    return link("/kernel?workload=" + encodeURIComponent(d.workload) + "&device=" + encodeURIComponent(d.device_key) +
                "&target=" + encodeURIComponent(d.target) + "&config=" + encodeURIComponent(json(config)), "source");
  }
  function drawChart(id, series, by) {
    var el = document.getElementById(id);
    if (!el) return;
    if (charts[id]) charts[id].update(series);
    else { el.replaceChildren(); charts[id] = window.tunefleetConvergence(el, series, by, el.clientWidth); }
    el.dataset.points = series.trial.length;
  }
  function loadTrials(jobId) {
    var url = "/api/jobs/" + jobId + "/trials" + (trialFilter ? "?status=" + encodeURIComponent(trialFilter) : "");
    fetch(url).then(function (r) { return r.json(); }).then(function (t) {
      document.getElementById("trial-count").textContent = t.total + " trials" + (t.shown < t.total ? " (newest " + t.shown + " shown)" : "");
      fill("trials", table([{ label: "trial", num: 1 }, { label: "status" }, { label: "time", num: 1 },
                            { label: "GFLOPS", num: 1 }, { label: "agent" }, { label: "config" }, { label: "message" }],
        t.trials.slice().reverse().map(function (r) {
          return { status: r.status, cells: [r.trial, h("span", { cls: r.status === "ok" ? "status-ok" : "status-err", text: r.status }),
                   ms(r.mean_s), gf(r.gflops), r.agent || "-", code(r.config), h("span", { cls: "msg", text: r.message || "" })] };
        }), { id: "trials-table", empty: "no trial" + (trialFilter ? " with status " + trialFilter : "") }));
    });
  }
  function actions(d) {
    var box = document.getElementById("job-actions");
    if (!d.can_cancel) { box.replaceChildren(); return; }
    if (box.querySelector("button")) return;
    var needsToken = app.dataset.tokens === "yes";
    var token = needsToken ? h("input", { type: "password", id: "client-token", placeholder: "client token",
                                          autocomplete: "off" }) : null;
    var notice = h("span", { cls: "notice", id: "cancel-notice" });
    var button = h("button", { cls: "danger", id: "cancel-job", text: "Cancel job" });
    button.addEventListener("click", function () {
      if (!window.confirm("Cancel job " + d.job_id + "?")) return;
      button.disabled = true;
      var headers = { "Content-Type": "application/json" };
      if (token && token.value) headers.Authorization = "Bearer " + token.value;
      fetch("/api/jobs/" + d.job_id + "/cancel", { method: "POST", headers: headers, body: "{}" })
        .then(function (r) { return r.json().then(function (b) { return [r.ok, b]; }); })
        .then(function (res) {
          notice.textContent = res[0] ? "cancelled" : res[1].error;
          button.disabled = res[0];
          refresh();
        });
    });
    box.replaceChildren.apply(box, [token, button, notice].filter(Boolean));
  }

  // -- workloads, workload, kernel --------------------------------------------------------------
  function workloads(d) {
    fill("workloads", table([{ label: "workload" }, { label: "best GFLOPS per device" }], d.map(function (w) {
      return { cells: [workloadLink(w.workload), w.best.map(function (b) {
        return b.device_key + "/" + b.target + ": " + gf(b.gflops);
      }).join(", ") || "-"] };
    }), { empty: "the log holds no workload" }));
  }
  function workload(d) {
    document.getElementById("workload-title").replaceChildren(h("span", { cls: "mono", text: d.workload }));
    fill("workload-sub", document.createTextNode((d.flops / 1e9).toPrecision(4) + " GFLOP per call, " + d.devices.length + " device(s)"));
    fill("devices", table([{ label: "device key" }, { label: "target" }, { label: "trials", num: 1 }, { label: "failed", num: 1 },
                           { label: "best time", num: 1 }, { label: "GFLOPS", num: 1 }, { label: "vs fastest", num: 1 },
                           { label: "best config" }, { label: "kernel" }],
      d.devices.map(function (r) {
        return { cells: [r.device_key, r.target, r.trials, r.failed, ms(r.best_mean_s), gf(r.gflops),
                         r.vs_fastest ? (r.vs_fastest * 100).toFixed(1) + "%" : "-", r.best_config ? code(r.best_config) : "-",
                         r.best_config ? link("/kernel?workload=" + encodeURIComponent(d.workload) + "&device=" +
                                              encodeURIComponent(r.device_key) + "&target=" + encodeURIComponent(r.target),
                                              "show-kernel") : "-"] };
      }), { id: "devices-table" }));
    history(d.history);
    fill("shapes", d.shapes.length ? h("div", {}, d.shapes.map(function (f) {
      var devices = [];
      f.members.forEach(function (m) { Object.keys(m.best_gflops).forEach(function (k) { if (devices.indexOf(k) < 0) devices.push(k); }); });
      return h("div", {}, [h("h3", { cls: "mono", text: f.family }),
        table([{ label: "shape" }].concat(devices.map(function (k) { return { label: k + " GFLOPS", num: 1 }; })),
          f.members.map(function (m) {
            return { cells: [m.workload === d.workload ? h("b", { text: m.workload }) : workloadLink(m.workload)]
              .concat(devices.map(function (k) { return gf(m.best_gflops[k]); })) };
          }))]);
    })) : h("p", { cls: "empty", text: "this workload belongs to no tuned shape range" }));
  }
  function history(groups) {
    var el = document.getElementById("chart-history");
    if (!el || !groups.length) return;
    var tables = groups.map(function (g) { return [g.time, g.best]; });
    var data = uPlot.join(tables);
    var colors = ["#d9480f", "#1c7ed6", "#2b8a3e", "#7048e8", "#e67700", "#0c8599"];
    var opts = {
      width: el.clientWidth || 900, height: 300, scales: { x: { time: true } },
      axes: [{}, { label: "GFLOPS", size: 60, values: function (u, splits) { return splits.map(gf); } }],
      series: [{}].concat(groups.map(function (g, i) {
        return { label: g.device_key + "/" + g.target, stroke: colors[i % colors.length], width: 2, spanGaps: true,
                 paths: uPlot.paths.stepped({ align: 1 }) };
      })),
    };
    el.replaceChildren();
    charts.history = new uPlot(opts, data, el);
    el.dataset.series = groups.length;
  }
  function kernel(d) {
    fill("kernel-sub", document.createTextNode(d.workload + " on " + d.device_key + " (" + d.target + "), config " + json(d.config) +
         (d.why ? " · " + d.why : "")));
    document.getElementById("kernel-source").textContent = d.source;
  }

  // -- models ------------------------------------------------------------------------------------
  function models(d) {
    fill("models", table([{ label: "model" }, { label: "tasks", num: 1 }, { label: "file" }], d.map(function (m) {
      return { cells: [link("/model?name=" + encodeURIComponent(m.model), m.model), m.tasks, m.source] };
    }), { empty: "no model: start the dashboard with --model MODEL.onnx" }));
  }
  function bar(share, cls) {
    return h("span", {}, [h("span", { cls: "bar " + (cls || ""), style: "width:" + Math.round(share * 160) + "px" }),
                          (share * 100).toFixed(1) + "%"]);
  }
  function model(d) {
    document.getElementById("model-title").replaceChildren("Model ", h("span", { cls: "mono", text: d.model }));
    fill("model-sub", document.createTextNode(d.source + (d.device_key ? " · on " + d.device_key + " (" + d.target + ")" : " · nothing tuned yet")));
    fill("model-devices", d.devices.length > 1 ? h("span", {}, ["device: "].concat(d.devices.map(function (g) {
      return link("/model?name=" + encodeURIComponent(d.model) + "&device=" + encodeURIComponent(g.device_key) +
                  "&target=" + encodeURIComponent(g.target), g.device_key + "/" + g.target + " ");
    }))) : document.createTextNode(""));
    fill("model-cards", cards([
      ["tasks", d.tasks.length], ["trials", d.trials],
      ["latency default", ms(d.latency_default_s)], ["latency tuned", ms(d.latency_tuned_s)],
      ["speed-up", d.latency_default_s && d.latency_tuned_s ? num(d.latency_default_s / d.latency_tuned_s) + "x" : "-"],
      ["tasks estimated", d.latency_tasks + " / " + d.tasks.length],
    ]));
    var tuned = d.tasks.reduce(function (s, t) { return s + (t.weighted_best_s || 0); }, 0);
    fill("model-tasks", table([{ label: "#", num: 1 }, { label: "workload" }, { label: "op" }, { label: "count", num: 1 },
                               { label: "trials", num: 1 }, { label: "budget" }, { label: "default", num: 1 },
                               { label: "best", num: 1 }, { label: "speed-up", num: 1 }, { label: "share of tuned latency" }],
      d.tasks.map(function (t) {
        return { cells: [t.task, workloadLink(t.workload), t.op_type, t.count, t.trials, bar(t.budget_share),
                         ms(t.default_s), ms(t.best_s), t.speedup ? num(t.speedup) + "x" : "-",
                         tuned && t.weighted_best_s ? bar(t.weighted_best_s / tuned, "muted") : "-"] };
      }), { id: "model-table" }));
  }

  // -- agents ----------------------------------------------------------------------------------
  function agents(d) {
    fill("agents", d.live ? table([{ label: "name" }, { label: "key" }, { label: "cpu / gpu" }, { label: "parallel", num: 1 },
                                   { label: "leased", num: 1 }, { label: "heartbeat", num: 1 }, { label: "trials", num: 1 },
                                   { label: "failed", num: 1 }, { label: "per minute", num: 1 }, { label: "overdue", num: 1 },
                                   { label: "state" }],
      d.agents.map(function (a) {
        var caps = a.capabilities || {};
        return { cells: [a.name, a.key, [caps.cpu_model, caps.gpu_name].filter(Boolean).join(" / ") || caps.arch || "-",
                         a.parallel, a.leased, num(a.seconds_since_heartbeat, 1) + " s ago", a.trials, a.failed,
                         a.trials_per_minute, a.overdue_leases, state(a.quarantined ? "quarantined" : "ok")] };
      }), { id: "agents-table", empty: "no agent registered" })
      : h("p", { cls: "empty", text: "registered agents are known to the daemon only: open its dashboard (tuner daemon --http-listen)" }));
    fill("measured-by", table([{ label: "agent" }, { label: "trials", num: 1 }, { label: "failed", num: 1 },
                               { label: "last trial" }, { label: "last minute", num: 1 }],
      d.measured_by.map(function (a) { return { cells: [a.name, a.trials, a.failed, when(a.last_trial_at), a.trials_per_minute] }; })));
    fill("devices", table([{ label: "device key" }, { label: "info" }], d.devices.map(function (x) {
      return { cells: [x.key, code(x.info)] };
    })));
  }

  var renderers = { overview: overview, job: job, workloads: workloads, workload: workload, kernel: kernel, agents: agents,
                    models: models, model: model };

  function render(d) { if (renderers[page] && d) renderers[page](d); }
  function refresh() {
    return fetch(apiUrl()).then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (d) { liveDot(true); render(d); }, function () { liveDot(false); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var raw = document.getElementById("page-data").textContent;
    render(raw ? JSON.parse(raw) : null);
    var select = document.getElementById("status-filter");
    if (select) select.addEventListener("change", function () {
      trialFilter = select.value;
      loadTrials(location.pathname.split("/").pop());
    });
    // Poll again refreshMs after an answer, or three times as long as the answer took (a job of
    // many trials on a busy log must not keep the server busy); a hidden tab does not poll and
    // catches up as soon as it is shown again.
    if (app.dataset.live === "yes") {
      liveDot(true);
      var poll = function () {
        if (document.hidden) { setTimeout(poll, refreshMs); return; }
        var started = Date.now();
        refresh().then(function () { setTimeout(poll, Math.max(refreshMs, 3 * (Date.now() - started))); });
      };
      setTimeout(poll, refreshMs);
      document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
    }
  });
})();

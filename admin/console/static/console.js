// The overview refreshes its figures every 2 s and charts the last two
// minutes of them. It builds the charts with DOM calls (no markup from
// data), so the page's Content-Security-Policy allows this file alone.
(function () {
  "use strict";
  var root = document.getElementById("overview");
  if (!root) { return; }
  var url = root.getAttribute("data-poll");
  var names = ["claims", "acquired", "replays", "mismatches", "inProgress", "completed", "conflicts", "fenced"];
  var keep = 60;
  var last = null, lastAt = 0;
  var series = {lag: []};
  names.forEach(function (n) { series[n] = []; });

  // push appends v to series n, keeping the last two minutes, and draws it.
  function push(n, v) {
    series[n].push(v);
    if (series[n].length > keep) { series[n].shift(); }
    draw("s-" + n, series[n]);
  }

  function text(id, value) {
    var el = document.getElementById(id);
    if (el) { el.textContent = value; }
  }

  function draw(id, values) {
    var svg = document.getElementById(id);
    if (!svg) { return; }
    var top = Math.max(1, Math.max.apply(null, values));
    var pts = values.map(function (v, i) {
      var x = 120 - (values.length - 1 - i) * (120 / (keep - 1));
      return x.toFixed(1) + "," + (23 - (v / top) * 22).toFixed(1);
    }).join(" ");
    var line = svg.firstChild;
    if (!line) {
      line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
      svg.appendChild(line);
    }
    line.setAttribute("points", pts);
    svg.setAttribute("aria-label", svg.getAttribute("aria-label").split(":")[0] + ": " + (values[values.length - 1] || 0).toFixed(1));
  }

  function ago(iso) {
    if (!iso) { return "none"; }
    var s = (Date.now() - Date.parse(iso)) / 1000;
    if (s < 60) { return Math.round(s) + "s ago"; }
    if (s < 172800) { return Math.round(s / 60) + "m ago"; }
    return Math.round(s / 86400) + " days ago";
  }

  function update(d) {
    var h = document.getElementById("health");
    if (h) { h.textContent = d.health; h.className = d.health === "ok" ? "ok" : "bad"; }
    text("p-abandoned", d.pending.abandoned);
    text("p-uncertain", d.pending.uncertain);
    text("p-escalated", d.pending.escalated);
    text("p-oldest", ago(d.pending.oldest));
    if (d.outbox) {
      text("o-lag", d.outbox.lag_events + " events");
      text("o-age", d.outbox.lag_seconds.toFixed(1) + " s");
      text("o-cursor", d.outbox.acked + " / " + d.outbox.last);
      push("lag", d.outbox.lag_events);
    }
    if (!d.counts) { return; }
    var now = Date.now();
    names.forEach(function (n) {
      var key = n.charAt(0).toUpperCase() + n.slice(1);
      var v = d.counts[key];
      text("c-" + n, v);
      if (last) {
        push(n, Math.max(0, (v - last[key]) / ((now - lastAt) / 1000)));
      }
    });
    last = d.counts; lastAt = now;
  }

  function poll() {
    fetch(url, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (d) { if (d) { update(d); } })
      .catch(function () {})
      .then(function () { setTimeout(poll, 2000); });
  }
  poll();
})();

/* The job page, live: long-poll GET /v1/jobs/<id>?wait=30 with the job's ETag, so the
   server answers as soon as the job changes (and the page does not poll), and update the
   page in place; cancel; copy the transcript. Without this script the page refreshes
   itself (<noscript>) and the server renders the same parts. */
(function () {
  "use strict";

  var NETWORK_ERROR = "Could not reach the server; check your connection and try again.";
  var FINISHED = ["COMPLETED", "FAILED", "CANCELLED", "EXPIRED"];

  var root = document.getElementById("job");
  if (!root || !window.fetch) return;

  function $(id) { return document.getElementById(id); }
  function table(name) {
    try { return JSON.parse(root.getAttribute(name)) || {}; } catch (e) { return {}; }  // raw codes then
  }
  var labels = table("data-labels");
  var STAGES = table("data-stages");
  var statusUrl = root.getAttribute("data-status-url");
  var cancelUrl = root.getAttribute("data-cancel-url");
  var current = root.getAttribute("data-status");
  var skew = 0;  // server clock minus ours, from the Date header, for the estimates
  var failures = 0;
  var cancelling = false;  // a cancel request is in flight, or was accepted
  var last = null;
  var timer = null;
  var resultShown = !$("result").hidden;  // the server rendered it already

  function finished(status) { return FINISHED.indexOf(status) >= 0; }
  // Not yet on the speech model: a queue position and a start time mean something.
  function waiting(job) { return job.status === "PENDING" || (job.status === "PROCESSING" && job.stage !== "infer"); }
  function setText(el, text) { if (el.textContent !== text) el.textContent = text; }
  function show(el, on) { el.hidden = !on; }

  /* Times as the server writes them (web/pages.py: clock, about). */
  function clock(seconds) {
    var tenths = Math.max(0, Math.round(Number(seconds || 0) * 10));
    var hours = Math.floor(tenths / 36000); tenths -= hours * 36000;
    var minutes = Math.floor(tenths / 600); tenths -= minutes * 600;
    var text = (minutes < 10 ? "0" : "") + minutes + ":" + (tenths < 100 ? "0" : "") + Math.floor(tenths / 10) + "." + (tenths % 10);
    return hours ? hours + ":" + text : text;
  }
  function about(seconds) {
    if (seconds < 5) return "a moment";
    if (seconds < 55) return "about " + Math.round(seconds / 5) * 5 + " s";
    if (seconds < 90 * 60) return "about " + Math.max(1, Math.round(seconds / 60)) + " min";
    return "about " + Math.round(seconds / 3600) + " h";
  }
  function fromNow(iso) {
    if (!iso) return null;
    var when = Date.parse(iso);
    if (isNaN(when)) return null;
    return about((when - (Date.now() + skew)) / 1000);
  }
  function sentence(message) {
    message = String(message);
    return message.charAt(0).toUpperCase() + message.slice(1) + (/[.!?]$/.test(message) ? "" : ".");
  }

  function renderStatus(job) {
    var status = job.status;
    var badge = $("status");
    setText(badge, labels[status] || status);
    badge.className = "badge status-" + String(status).toLowerCase();
    badge.setAttribute("data-status", status);
    root.setAttribute("data-status", status);
    document.title = (labels[status] || status) + " · " + (job.filename || "Job") + " · whisperq";

    var detail = "";
    if (status === "PROCESSING" && Object.prototype.hasOwnProperty.call(STAGES, job.stage)) detail = STAGES[job.stage];
    else if (status === "PENDING" && job.next_attempt_at) detail = "Retrying after a temporary problem";
    else if (status === "CANCELLED") detail = "Stopped at your request.";
    else if (status === "COMPLETED") detail = "The transcript is below.";
    setText($("status-detail"), detail);

    var bar = $("progress");
    show(bar, !finished(status));
    if (typeof job.progress === "number" && (job.progress > 0 || status === "PROCESSING")) {
      bar.value = Math.max(0, Math.min(1, job.progress));
      bar.setAttribute("aria-valuetext", Math.round(bar.value * 100) + " %");
    } else {
      bar.removeAttribute("value");  // indeterminate: waiting, or no progress reported
      bar.removeAttribute("aria-valuetext");
    }

    var queue = $("queue");
    var ahead = job.queue_position;
    if (waiting(job) && typeof ahead === "number") {
      setText(queue, ahead === 0 ? "Yours is next in the queue" : ahead + (ahead === 1 ? " job" : " jobs") + " ahead of yours");
      show(queue, true);
    } else {
      show(queue, false);
    }

    renderEta(job);

    var error = $("error");
    var failed = (status === "FAILED" || status === "EXPIRED") && job.error;
    setText(error, failed ? sentence(job.error) : "");
    show(error, !!failed);

    var button = $("cancel");
    show(button, !finished(status));
    button.disabled = cancelling || !!job.cancel_requested;
    if (finished(status)) setText($("cancel-status"), "");
  }

  function renderEta(job) {
    var eta = $("eta");
    var parts = [];
    if (!finished(job.status)) {
      var starts = waiting(job) ? fromNow(job.estimated_start_at) : null;
      var done = fromNow(job.estimated_finish_at);
      if (starts) parts.push("Starts in " + starts);
      if (done) parts.push((parts.length ? "done" : "Done") + " in " + done);
    }
    setText(eta, parts.join(" · "));
    show(eta, parts.length > 0);
  }

  // A word the model was less sure of than this is marked for a reviewer (job.html's `low`).
  var LOW = 0.5;

  function segmentItem(seg, previous) {
    var li = document.createElement("li");
    var time = document.createElement("time");
    time.textContent = clock(seg.start);
    time.title = clock(seg.start) + " to " + clock(seg.end);
    var text = document.createElement("span");
    text.className = "text";
    if (seg.speaker && (!previous || previous.speaker !== seg.speaker)) {  // a new turn
      var who = document.createElement("b");
      who.className = "speaker";
      who.textContent = "Speaker " + seg.speaker;
      text.appendChild(who);
      text.appendChild(document.createTextNode(" "));
    }
    if (seg.words && seg.words.length) {
      seg.words.forEach(function (w) {
        var span = document.createElement("span");
        var sure = typeof w.probability === "number";
        span.className = "word" + (sure && w.probability < LOW ? " unsure" : "");
        span.title = clock(w.start) + (sure ? " · " + Math.round(w.probability * 100) + "% sure" : "");
        span.textContent = w.word;
        text.appendChild(span);
      });
    } else {
      text.textContent = seg.text || "";
    }
    li.appendChild(time);
    li.appendChild(document.createTextNode(" "));
    li.appendChild(text);
    return li;
  }

  function renderResult(job) {
    var result = job.result;
    if (!result) return;
    var list = $("segments");
    list.textContent = "";
    (result.segments || []).forEach(function (seg, n) { list.appendChild(segmentItem(seg, result.segments[n - 1])); });
    setText($("full-text"), String(result.text || "").trim());
    if (result.language) setText($("language"), result.language);
    show($("partial-note"), !!result.partial);
    show($("downloads"), job.status === "COMPLETED");
    if (job.status === "COMPLETED" && job.transcript_urls) {
      Array.prototype.forEach.call(document.querySelectorAll("#downloads a[data-format]"), function (a) {
        var url = job.transcript_urls[a.getAttribute("data-format")];
        if (url) a.href = url + (url.indexOf("?") >= 0 ? "&" : "?") + "download=1";
      });
    }
    show($("result"), true);
  }

  function render(job) {
    if (finished(current) && !finished(job.status)) return;  // a reply that left before the job ended
    last = job;
    if (job.cancel_url) cancelUrl = job.cancel_url;
    renderStatus(job);
    if (finished(job.status) && job.result && !resultShown) {
      renderResult(job);
      resultShown = true;
    }
    current = job.status;
  }

  var etag = null;

  /* The first request reads the job as it is now (no wait) and takes its ETag; each one after
     is a long-poll from that ETag, answered when the job changes. A 429 or 503 says, in
     Retry-After, when to come back. */
  function poll() {
    var headers = { Accept: "application/json" };
    if (etag) headers["If-None-Match"] = etag;
    var url = etag ? statusUrl + (statusUrl.indexOf("?") < 0 ? "?" : "&") + "wait=30" : statusUrl;
    var sent = Date.now();
    // At most one request a second, even from a server (or proxy) that answers at once.
    function again() { schedule(Math.max(0, 1000 - (Date.now() - sent))); }
    fetch(url, { headers: headers, cache: "no-store" })
      .then(function (resp) {
        var date = Date.parse(resp.headers.get("Date") || "");
        if (!isNaN(date) && Math.abs(date - Date.now()) > 5000) skew = date - Date.now();
        var retry = parseInt(resp.headers.get("Retry-After") || "", 10);
        if (resp.status === 304) return { ok: true, status: 304, body: null };
        if (resp.ok) etag = resp.headers.get("ETag") || null;
        return resp.json().then(function (body) {
          return { ok: resp.ok, status: resp.status, body: body, retry: isNaN(retry) ? null : retry };
        });
      })
      .then(function (r) {
        if (r.status === 304) { failures = 0; again(); return; }  // unchanged for 30 s: wait again
        if ((r.status === 429 || r.status === 503) && r.retry !== null) {
          schedule(Math.min(60, Math.max(1, r.retry)) * 1000);  // as the server asks
          return;
        }
        if (!r.ok) {
          var message = r.body && r.body.error && r.body.error.message;
          if (r.status === 404) { showProblem(sentence(message || "This job no longer exists")); return; }
          throw new Error(message || "HTTP " + r.status);
        }
        failures = 0;
        showProblem("");
        render(r.body);
        if (!finished(r.body.status)) again();  // the next long-poll answers when the job changes
      })
      .catch(function () {
        failures += 1;
        if (failures >= 3) showProblem("Lost contact with the server; still trying…");
        schedule(Math.min(10000, 1000 * Math.pow(2, failures)));
      });
  }

  function schedule(ms) {
    clearTimeout(timer);
    timer = setTimeout(poll, ms);
  }

  function showProblem(message) {
    var box = $("status-detail");
    if (message) setText(box, message);
    else if (box.textContent.indexOf("Lost contact") === 0) setText(box, "");
  }

  function cancel() {
    var button = $("cancel");
    var errorBox = $("cancel-error");
    errorBox.hidden = true;
    button.disabled = true;
    cancelling = true;
    setText($("cancel-status"), "Cancelling…");
    var csrf = document.querySelector("meta[name=csrf-token]");
    fetch(cancelUrl, { method: "POST", headers: { Accept: "application/json", "X-CSRF-Token": csrf ? csrf.content : "" } })
      .then(function (resp) {
        return resp.json().catch(function () { return null; }).then(function (body) {
          if (!resp.ok) {
            var message = body && body.error && body.error.message;
            throw new Error(message ? sentence(message) : "The job could not be cancelled (HTTP " + resp.status + ").");
          }
          return body;
        });
      }, function () { throw new Error(NETWORK_ERROR); })
      .then(function (body) {
        setText($("cancel-status"), "");
        var job = body && (body.status ? body : body.job);
        if (job && job.status) {
          if (!job.filename && last) job.filename = last.filename;
          render(job);
        }
        if (job && finished(job.status) && !("result" in job)) schedule(0);  // a short answer: fetch the whole job
        if (!job || !finished(job.status)) {
          setText($("cancel-status"), "Cancel requested; the job stops at the next point it can.");
          schedule(0);
        }
      })
      .catch(function (err) {
        cancelling = false;
        button.disabled = false;
        setText($("cancel-status"), "");
        errorBox.textContent = err.message;
        errorBox.hidden = false;
        schedule(0);  // show where the job really is (it may have just finished)
      });
  }

  function copyText() {
    var text = $("full-text").textContent;
    var status = $("copy-status");
    function done(ok) {
      setText(status, ok ? "Copied to the clipboard." : "Copying is blocked here; select the text and copy it.");
      setTimeout(function () { setText(status, ""); }, 4000);
    }
    function fallback() {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      document.body.removeChild(area);
      done(ok);
    }
    // navigator.clipboard exists only on https and localhost; plain-http intranets fall back.
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, fallback);
    } else {
      fallback();
    }
  }

  $("copy").addEventListener("click", copyText);
  $("cancel").addEventListener("click", cancel);
  show($("cancel"), !finished(current));
  if (!finished(current)) schedule(0);
  // Keep "starts in about 20 s" counting down between polls (and after a lost connection).
  setInterval(function () { if (last) renderEta(last); }, 1000);
})();

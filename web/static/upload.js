/* The upload form, enhanced: drag and drop, the chosen file's name and size, a size
   check before sending, and a submit through the JSON API with upload progress.
   Without this script the form posts to / and the server redirects to the job page. */
(function () {
  "use strict";

  var NETWORK_ERROR = "Could not reach the server; check your connection and try again.";

  var form = document.getElementById("upload");
  if (!form || !window.FormData || !window.XMLHttpRequest) return;

  var input = document.getElementById("file");
  var zone = document.getElementById("dropzone");
  var info = document.getElementById("file-info");
  var errorBox = document.getElementById("error");
  var button = document.getElementById("submit");
  var bar = document.getElementById("upload-progress");
  var note = document.getElementById("upload-status");
  var maxBytes = Number(form.getAttribute("data-max-bytes")) || 0;
  var maxMb = form.getAttribute("data-max-mb");

  function size(bytes) {
    if (bytes < 1024) return bytes + " bytes";
    if (bytes < 1024 * 1024) return (bytes / 1024).toFixed(0) + " KB";
    if (bytes < 1024 * 1024 * 1024) return (bytes / 1048576).toFixed(1) + " MB";
    return (bytes / 1073741824).toFixed(2) + " GB";
  }

  function showError(message) {
    errorBox.textContent = message;
    errorBox.hidden = false;
  }

  function clearError() {
    errorBox.textContent = "";
    errorBox.hidden = true;
  }

  function chosen() {
    return input.files && input.files.length ? input.files[0] : null;
  }

  function tooLarge(file) {
    return maxBytes && file.size > maxBytes;
  }

  function describe(keepError) {
    var file = chosen();
    if (!keepError) clearError();
    zone.classList.toggle("has-file", !!file);
    if (!file) { info.textContent = ""; return; }
    info.textContent = file.name + " · " + size(file.size);
    if (tooLarge(file)) {
      showError("This file is " + size(file.size) + "; the limit is " + maxMb + " MB. Choose a smaller file, or shorten or compress the recording.");
    }
  }

  input.addEventListener("change", function () { describe(false); });

  // Drag and drop onto the whole zone; the browser hands the files to the real input.
  ["dragenter", "dragover"].forEach(function (name) {
    zone.addEventListener(name, function (event) {
      event.preventDefault();
      if (event.dataTransfer) event.dataTransfer.dropEffect = "copy";
      zone.classList.add("dragging");
    });
  });
  ["dragleave", "dragend"].forEach(function (name) {
    zone.addEventListener(name, function (event) {
      if (!zone.contains(event.relatedTarget)) zone.classList.remove("dragging");
    });
  });
  zone.addEventListener("drop", function (event) {
    event.preventDefault();
    zone.classList.remove("dragging");
    var files = event.dataTransfer && event.dataTransfer.files;
    if (!files || !files.length) return;
    if (files.length > 1) {
      showError("Drop one file at a time; each file becomes its own job.");
      return;
    }
    try {
      input.files = files;
    } catch (e) {
      showError("This browser cannot take dropped files here; use the file picker instead.");
      return;
    }
    describe(false);
  });
  // A file dropped beside the zone should not make the browser leave the page.
  window.addEventListener("dragover", function (event) { event.preventDefault(); });
  window.addEventListener("drop", function (event) { event.preventDefault(); });

  function busy(on) {
    button.disabled = on;
    form.setAttribute("aria-busy", on ? "true" : "false");
    bar.hidden = !on;
    if (on) { bar.value = 0; bar.removeAttribute("value"); }
    if (!on) note.textContent = "";
  }

  function apiError(xhr) {
    var body = null;
    try { body = JSON.parse(xhr.responseText); } catch (e) { /* not JSON: a proxy's page */ }
    if (body && body.error && body.error.message) {
      var message = String(body.error.message);
      return message.charAt(0).toUpperCase() + message.slice(1) + (/[.!?]$/.test(message) ? "" : ".");
    }
    if (xhr.status === 413) return "The file is larger than the limit of " + maxMb + " MB.";
    if (xhr.status >= 500) return "The server had a problem (HTTP " + xhr.status + "); try again in a moment.";
    return "The upload was refused (HTTP " + xhr.status + ").";
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var file = chosen();
    clearError();
    if (!file) { showError("Choose an audio file first."); input.focus(); return; }
    if (tooLarge(file)) { describe(false); return; }

    // Every option the form shows (language, priority, model and "More options"), as the
    // form itself would send them; the file as chosen or dropped; the CSRF token as a header.
    var data = new FormData(form);
    data.delete("csrf_token");
    data.set("file", file, file.name);

    var xhr = new XMLHttpRequest();
    xhr.open("POST", form.getAttribute("data-api-url"));
    xhr.setRequestHeader("Accept", "application/json");
    var csrf = document.querySelector("meta[name=csrf-token]");
    if (csrf) xhr.setRequestHeader("X-CSRF-Token", csrf.content);  // the session's token (web/auth.py)
    xhr.upload.addEventListener("progress", function (e) {
      if (!e.lengthComputable) return;
      bar.max = e.total;
      bar.value = e.loaded;
      note.textContent = e.loaded < e.total
        ? "Uploading… " + Math.floor(100 * e.loaded / e.total) + " %"
        : "Checking the audio…";
    });
    xhr.addEventListener("load", function () {
      var body = null;
      try { body = JSON.parse(xhr.responseText); } catch (e) { /* handled below */ }
      if ((xhr.status === 202 || xhr.status === 200) && body && body.job_id) {
        note.textContent = "Uploaded; opening the job…";
        window.location.assign(form.getAttribute("data-job-url").replace("JOB_ID", encodeURIComponent(body.job_id)));
        return;
      }
      busy(false);
      showError(apiError(xhr));
    });
    xhr.addEventListener("error", function () { busy(false); showError(NETWORK_ERROR); });
    xhr.addEventListener("abort", function () { busy(false); });
    busy(true);
    note.textContent = "Uploading…";
    xhr.send(data);
  });

  if (chosen()) describe(true);  // a file the browser kept (back button, or the form shown again)
})();

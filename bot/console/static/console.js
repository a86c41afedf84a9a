// Chatflow console: live transcripts over Server-Sent Events, times in the
// reader's own zone, Ctrl+Enter to send. Everything works without this file
// (plain links and forms); it only saves the reload.
"use strict";
(function () {
  function localTimes(root) {
    var times = root.querySelectorAll(".msg time[datetime]");
    for (var i = 0; i < times.length; i++) {
      var when = new Date(times[i].getAttribute("datetime"));
      if (!isNaN(when.getTime())) {
        times[i].textContent = when.toLocaleTimeString([], { hour: "numeric", minute: "2-digit" });
      }
    }
  }

  var forms = document.querySelectorAll("form.reply textarea");
  for (var f = 0; f < forms.length; f++) {
    forms[f].addEventListener("keydown", function (event) {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && this.form) {
        event.preventDefault();
        this.form.requestSubmit ? this.form.requestSubmit() : this.form.submit();
      }
    });
  }

  var list = document.getElementById("messages");
  if (!list) {
    return;
  }
  var head = document.getElementById("conv-head");
  var base = list.getAttribute("data-base");
  function nearBottom() {
    var box = list.scrollHeight > list.clientHeight + 4 ? list : document.scrollingElement;
    return !box || box.scrollHeight - box.scrollTop - box.clientHeight < 160;
  }
  function toBottom() {
    // The list scrolls by itself beside the inbox; on a phone the page scrolls.
    if (list.scrollHeight > list.clientHeight + 4) {
      list.scrollTop = list.scrollHeight;
    } else {
      window.scrollTo(0, document.documentElement.scrollHeight);
    }
  }
  localTimes(list);
  toBottom();
  if (!window.EventSource || !window.fetch) {
    return;
  }
  function refresh() {
    fetch(base + "/live", { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var follow = nearBottom();
        var box = document.createElement("div");
        box.innerHTML = html; // rendered and escaped by the server
        var messages = box.querySelector("#live-messages");
        var header = box.querySelector("#live-head");
        if (messages) {
          list.innerHTML = messages.innerHTML;
          localTimes(list);
        }
        if (header && head) {
          head.innerHTML = header.innerHTML;
        }
        list.setAttribute("data-updated", String(Date.now()));
        if (follow) {
          toBottom();
        }
      })
      .catch(function () {
        /* the next event tries again */
      });
  }
  var source = new EventSource(base + "/events");
  source.addEventListener("changed", refresh);
})();

// Chatflow console: live transcripts over Server-Sent Events. Everything works
// without this file (plain links and forms); it only saves the reload.
"use strict";
(function () {
  var list = document.getElementById("messages");
  if (!list || !window.EventSource || !window.fetch) {
    return;
  }
  var base = list.getAttribute("data-base");
  function toBottom() {
    list.lastElementChild && list.lastElementChild.scrollIntoView({ block: "end" });
  }
  function refresh() {
    fetch(base + "/messages", { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        list.innerHTML = html; // rendered and escaped by the server
        list.setAttribute("data-updated", String(Date.now()));
        toBottom();
      })
      .catch(function () {
        /* the next event tries again */
      });
  }
  var source = new EventSource(base + "/events");
  source.addEventListener("changed", refresh);
  toBottom();
})();

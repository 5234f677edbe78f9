// The live timeline of a running turn: rows arrive as server-sent events (rendered on the
// server), the page reloads once the turn ends to show its reply and spend.
(function () {
  "use strict";
  var table = document.getElementById("timeline");
  if (!table || table.dataset.live !== "1") return;
  var body = table.querySelector("tbody");
  var status = document.getElementById("turn-status");
  var source = new EventSource(table.dataset.events);
  source.addEventListener("step", function (message) {
    var data = JSON.parse(message.data);
    var holder = document.createElement("tbody");
    holder.innerHTML = data.html;
    var row = holder.firstElementChild;
    var old = document.getElementById(row.id);
    if (old) { old.replaceWith(row); } else { body.appendChild(row); }
    if (status) { status.textContent = data.status; status.className = "status " + data.status; }
    ["attempts", "crashes"].forEach(function (name) {
      var cell = document.getElementById(name);
      if (cell) { cell.textContent = String(data[name]); }
    });
    table.dataset.lastStep = String(data.step);
  });
  source.addEventListener("end", function () {
    source.close();
    window.location.reload();
  });
  // a row of the turn does not open in this console (a key it lacks, a tampered value):
  // the page shows it marked; asking again would fail the same way
  source.addEventListener("unreadable", function () {
    source.close();
  });
})();

// The demo page on /chat, written for message_bus's MessageBus API; Herald's client (/message-bus/herald.js,
// loaded before this file) provides it. The page would work unchanged with message-bus.js.
(function () {
  "use strict";
  var bus = window.MessageBus;
  var list = document.getElementById("messages");
  var status = document.getElementById("status");
  var form = document.getElementById("chat-form");
  var RECENT = 20;

  function show(data, globalId, messageId) {
    var item = document.createElement("li");
    item.dataset.messageId = messageId;
    var id = document.createElement("span");
    id.className = "id";
    id.textContent = "#" + messageId;
    item.appendChild(id);
    if (data && typeof data === "object" && "text" in data) {
      var name = document.createElement("span");
      name.className = "name";
      name.textContent = data.name || "cli";
      item.appendChild(name);
      item.appendChild(document.createTextNode(String(data.text)));
    } else {
      item.appendChild(document.createTextNode(JSON.stringify(data)));
    }
    list.appendChild(item);
    while (list.children.length > 200) list.removeChild(list.firstChild);
    status.textContent = "live: last message #" + messageId;
  }

  // -(RECENT + 1): message_bus's lookbehind, the last RECENT messages and then everything new.
  bus.subscribe("/chat", show, -(RECENT + 1));
  status.textContent = "live";

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    var text = document.getElementById("text");
    var body = new URLSearchParams(new FormData(form)).toString();
    var xhr = new XMLHttpRequest();
    xhr.open("POST", "/chat", true);
    xhr.setRequestHeader("Content-Type", "application/x-www-form-urlencoded");
    xhr.onload = function () {
      if (xhr.status === 201) text.value = "";
      else status.textContent = "not sent: " + xhr.responseText;
    };
    xhr.send(body);
  });
})();

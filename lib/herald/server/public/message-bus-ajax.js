// Herald's ajax adapter for message_bus's JS client (loaded after /assets/message-bus.js).
(function () {
  "use strict";
  // message_bus's client needs an `ajax` function (jQuery's by default). A small XMLHttpRequest one:
  // it posts the form-encoded poll, hands the XHR to the client for streaming (onprogress), and
  // reports an aborted request as "abort" so the client re-polls at once.
  window.MessageBus.ajax = function (options) {
    var xhr = new XMLHttpRequest();
    var aborted = false;
    xhr.open("POST", options.url, true);
    xhr.setRequestHeader("Content-Type", "application/x-www-form-urlencoded");
    Object.keys(options.headers || {}).forEach(function (name) {
      xhr.setRequestHeader(name, options.headers[name]);
    });
    if (options.messageBus && options.messageBus.chunked) {
      options.messageBus.onProgressListener(xhr);
    }
    xhr.onreadystatechange = function () {
      if (xhr.readyState !== 4) return;
      if (!aborted && ((xhr.status >= 200 && xhr.status < 300) || xhr.status === 304)) {
        options.success(xhr.responseText);
      } else {
        options.error(xhr, aborted ? "abort" : xhr.statusText || "error");
      }
      options.complete();
    };
    xhr.send(new URLSearchParams(options.data).toString());
    var abort = xhr.abort.bind(xhr);
    xhr.abort = function () {
      aborted = true;
      abort();
    };
    return xhr;
  };
})();

// Preloaded into a Node server a test starts (NODE_OPTIONS=--require this file): a server
// that listens on a port alone listens on 127.0.0.1 only, never on every interface.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  if (typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port))) {
    const callbacks = args.slice(1).filter((arg) => typeof arg === "function");
    return listen.call(this, Number(port), "127.0.0.1", ...callbacks);
  }
  return listen.apply(this, args);
};

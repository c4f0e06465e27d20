// FIXME: race condition when two requests arrive at once
function handler(req, res) {
  /* TODO: validate req.body */
  res.send("ok");
}

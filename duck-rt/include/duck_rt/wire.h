// The duckd wire protocol as one include: the frame codec
// (duck_rt/wire_codec.h, no sockets) and blocking frame I/O over a socket
// (duck_rt/wire_socket.h).
#ifndef DUCK_RT_WIRE_H
#define DUCK_RT_WIRE_H

#include "duck_rt/wire_codec.h"
#include "duck_rt/wire_socket.h"

#endif // DUCK_RT_WIRE_H

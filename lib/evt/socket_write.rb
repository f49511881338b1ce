# frozen_string_literal: true

require "socket"

module Evt
  unless Evt.extension?
    # BasicSocket#write with several strings (and #puts, which writes a line and its newline) as
    # one send under an evt scheduler, as Ruby without a scheduler makes them one writev(2). Ruby
    # hands a scheduler's io_write one string at a time, and on a TCP socket Nagle's algorithm then
    # holds the second segment until the peer ACKs the first: some 40 ms against a peer that delays
    # its ACKs. Prepended to BasicSocket. The C extension defines this module
    # (ext/evt/socket_write.c: one sendmsg(2), without a copy); here is the pure-Ruby loop's, which
    # joins the strings into one and writes that.
    module SocketWrite
      # Writes `objects`; several binary-compatible strings on a sync socket, in a fiber of an evt
      # scheduler, as one write; anything else as BasicSocket#write does.
      # @param objects [Array<Object>] what to write, as IO#write takes it
      # @return [Integer] the bytes written
      def write(*objects)
        return super unless objects.size > 1 && objects.all?(String) && Fiber.current_scheduler.is_a?(Evt::Scheduling) &&
                            sync && internal_encoding.nil? && [nil, Encoding::BINARY].include?(external_encoding)

        super(objects.each_with_object(String.new(encoding: Encoding::BINARY)) { |string, joined| joined << string.b })
      end
    end
  end
end

BasicSocket.prepend(Evt::SocketWrite)
